"""Wires `mi_probe` into training: the MI probe and the collapse detector.

Probe: every `probe.every` steps, on the batch before filtering, cross-score reasoning
segments under prompts and log the MI estimates (`probe/...`), timed on their own
(`probe/time_s`) and left out of the step time. Two ways to pick the pairs
(`probe.mode`):

* `first_turn`: rows are first-turn reasoning segments, subsampled to `num_samples`
  without replacement; one column per group among the sampled rows, its first-turn
  prompt. As in RAGEN-2, a group with no sampled reasoning has no column: an unowned
  column would raise MI's bound from log 3 to log 4 (say) and lower chance retrieval.
* `trajectory`: `num_samples` (trajectory m, turn t) pairs drawn i.i.d. with
  probability 1/M * 1/T_m (T_m = m's turns with a reasoning segment, M = trajectories
  with at least one), so every trajectory weighs the same whatever its length. Each
  pair is its own column: the prompt is the whole context before that turn's reasoning.

What a row scores (`probe.segment`): `reasoning` (RAGEN-2), the text between `<think>` and
`</think>`; or `reply`, all the tokens the policy sampled in that turn. A reply segment asks the
same question of the whole turn (does what the model wrote depend on its input?) and has a row
for every rollout, so it gives a probe in answer-only mode, or with a model that rarely closes
`</think>`, where the reasoning segment has next to no rows.

What the scoring computes in (`probe.dtype`): by default the policy's compute dtype, as RAGEN-2
scores with the actor's own bf16 forward (bf16 where `model.dtype` resolved it, fp32 on a CPU
without bf16 units); `float32` for MI compared across machines. The logits are upcast before the
log-softmax either way, and every row records the dtype (`probe/dtype`).

The probe draws its subsample from its own RNG keyed by the step, never from the training
generator, so turning it on or off does not change the training trajectory. Rows whose scores
are not finite (a NaN from the model) are dropped and counted (`probe/num_nonfinite_dropped`),
and columns left without a row go with them: a NaN in a diagnostic never ends a run.

CollapseWatch: each step's logged series go to `mi_probe.CollapseDetector`; its alerts
become `alert` events in the run directory (and a printed line); the alert that
`probe.stop_on_collapse` / `probe.stop_on_early_warning` name is handed to the trainer's stoppers.
"""

from __future__ import annotations

import itertools
import math
import time

import torch

import mi_probe
from envs.parsing import THINK_OPEN
from ragen2 import metric_names as names
from ragen2 import precision
from ragen2 import seeding
from ragen2.config import ProbeSection

EARLY_WARNINGS = ("reward_std_cliff", "grad_norm_spike", "degeneration")
# detector input -> the metric keys the trainer logs it under, the first present wins. The reward
# spread is the filter's own (snr/reward_std_mean: every group, before filtering, with filter.ddof),
# so the watch sees the spread the filter ranks by; rows without it (a caller's own) give rollout's.
WATCHED_SERIES = {
    "mi_zscore_ema": (names.PROBE_MI_ZSCORE_EMA,),
    "entropy": (names.ACTOR_ENTROPY,),
    "reward_std": (names.SNR_REWARD_STD_MEAN, names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN),
    "grad_norm": (names.ACTOR_GRAD_NORM,),
    "degenerate_fraction": (names.ROLLOUT_DEGENERATE_FRACTION,),
}


def resolve_segment(cfg: ProbeSection, requires_think: bool) -> str | None:
    """Resolve `probe.segment=auto` in place: reasoning where the env requires `<think>`, else
    reply (an answer-only env writes no reasoning, so a reasoning probe would have no rows).
    Returns a line saying what was chosen and why, or None when the segment was set."""
    if cfg.segment != "auto":
        return None
    cfg.segment = "reasoning" if requires_think else "reply"
    why = "the env requires <think>" if requires_think else "the env is answer-only (no <think> to score)"
    return f"probe.segment=auto resolved to {cfg.segment}: {why}"


def resolve_run_segment(cfg) -> str | None:
    """`resolve_segment` for a run's whole config (either engine): the training env decides."""
    if cfg.probe.segment != "auto":
        return None
    import envs  # the registry: only where a segment is to be decided

    env_config = envs.spec(cfg.env.name).make_config(**cfg.env.overrides)
    return resolve_segment(cfg.probe, bool(getattr(env_config, "require_think", True)))


class Probe:
    def __init__(self, cfg: ProbeSection, tokenizer):
        if cfg.segment == "auto":  # a caller that knows no env (the engines resolve it first): RAGEN-2's
            cfg = cfg.model_copy(update={"segment": "reasoning"})
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.ema = mi_probe.ZScoreEMA(decay=0.9)
        self.think_ids = tokenizer(THINK_OPEN, add_special_tokens=False)["input_ids"]
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)

    def due(self, step: int) -> bool:
        return self.cfg.every > 0 and step % self.cfg.every == 0

    def maybe_run(self, step: int, policy, batch) -> dict:
        if not self.due(step):
            return {}
        started = time.perf_counter()
        out = self.measure(policy, batch, step, update_ema=True)
        out[names.PROBE_TIME_S] = time.perf_counter() - started
        return out

    def measure(self, policy, batch, step: int, update_ema: bool = True) -> dict:
        """`probe/...` metrics of one batch (MI-ZScore-EMA only when the EMA is updated)."""
        # every row says what it scored in (or would have), so runs scored differently are told apart
        dtype = {names.PROBE_DTYPE: dtype_name(self.scoring_dtype(policy))}
        prompts, reasonings, owners = self.pairs(batch, step)
        if len(set(owners)) < 2:
            return {names.PROBE_SKIPPED_TOO_FEW_GROUPS: 1.0, "probe/num_pairs": float(len(owners)), **dtype}
        with self.scoring_precision(policy):
            scores = mi_probe.cross_score(policy, prompts, reasonings, owners, pad_token_id=self.pad_id)
        L, L_sum, owner, column_ids, nonfinite = usable_scores(scores)
        if len(column_ids) < 2:  # every other reasoning was empty or scored NaN
            return {names.PROBE_SKIPPED_TOO_FEW_GROUPS: 1.0, "probe/num_pairs": float(len(owners)),
                    "probe/num_nonfinite_dropped": float(nonfinite), **dtype}
        metrics = mi_probe.mi_metrics_both(L, L_sum, owner, column_ids=column_ids)
        if update_ema:
            metrics.update(self.ema.update(metrics))
        metrics["num_empty_dropped"] = float(scores.num_empty_dropped)
        metrics["num_nonfinite_dropped"] = float(nonfinite)
        return {**{names.PROBE + key: float(value) for key, value in metrics.items()}, **dtype}

    def scoring_dtype(self, policy) -> torch.dtype:
        """What the cross-scoring's matmuls run in (`probe.dtype`): the policy's compute dtype (bf16
        where model.dtype resolved it, fp32 on a CPU without bf16 units), or its fp32 weights' own."""
        return precision.compute_dtype(policy) if self.cfg.dtype == "policy" else _weights_dtype(policy)

    def scoring_precision(self, policy):
        """The context `scoring_dtype` runs in: the policy's autocast, or none at all (the weights'
        own dtype, even inside a caller's bf16 autocast). The logits are upcast to fp32 before the
        log-softmax either way (mi_probe)."""
        if self.scoring_dtype(policy) == _weights_dtype(policy):
            return precision.full_precision(policy)
        return precision.autocast(policy)

    def pairs(self, batch, step: int):
        """(prompts, reasonings, owners) for cross-scoring, in the configured mode."""
        if self.cfg.mode == "trajectory":
            return self.trajectory_pairs(batch, step)
        return self.first_turn_pairs(batch, step)

    def segment_spans(self, batch) -> list[tuple[int, int, int, int]]:
        """(row, turn, start, end) of every segment the probe may score, per `probe.segment`."""
        if self.cfg.segment == "reply":
            return reply_spans(batch.turn_index)
        return batch.reasoning_spans

    def first_turn_pairs(self, batch, step: int):
        """Rows: first-turn segments; columns: the first prompt (+ `<think>` for reasoning) of
        each group that owns a sampled row (RAGEN-2: the groups present among the valid pairs)."""
        group_of_row = batch.group_ids.tolist()
        spans = [(row, start, end) for row, turn, start, end in self.segment_spans(batch) if turn == 0 and end > start]
        rng = seeding.probe_rng(step)
        if len(spans) > self.cfg.num_samples:
            picked = sorted(rng.choice(len(spans), size=self.cfg.num_samples, replace=False).tolist())
            spans = [spans[i] for i in picked]
        owned = {group_of_row[row] for row, _, _ in spans}
        first_sampled = batch.response_mask.float().argmax(dim=1).tolist()
        prompt_of_group: dict[int, list[int]] = {}
        for row, group in enumerate(group_of_row):
            if group in owned and group not in prompt_of_group:
                prompt = batch.input_ids[row, :first_sampled[row]].tolist()
                # A reply is scored after the prompt as sampled. Reasoning follows "<think>", which
                # the rollout usually prefills already (RAGEN's layout).
                tail = self.tokenizer.decode(prompt[-8:], skip_special_tokens=False)
                needs_think = self.cfg.segment == "reasoning" and not tail.endswith(THINK_OPEN)
                prompt_of_group[group] = prompt + self.think_ids if needs_think else prompt
        groups = sorted(prompt_of_group)
        column = {group: index for index, group in enumerate(groups)}
        reasonings = [batch.input_ids[row, start:end].tolist() for row, start, end in spans]
        owners = [column[group_of_row[row]] for row, _, _ in spans]
        return [prompt_of_group[g] for g in groups], reasonings, owners

    def trajectory_pairs(self, batch, step: int):
        """`num_samples` (trajectory, turn) pairs, P = 1/M * 1/T_m; one column per pair."""
        turns_of: dict[int, list[tuple[int, int, int]]] = {}  # trajectory -> its (row, start, end) by turn
        traj_of_row = batch.traj_index.tolist()
        for row, turn, start, end in sorted(self.segment_spans(batch), key=lambda s: (traj_of_row[s[0]], s[1])):
            if end > start:
                turns_of.setdefault(traj_of_row[row], []).append((row, start, end))
        trajectories = sorted(turns_of)
        counts = [len(turns_of[m]) for m in trajectories]
        rng = seeding.probe_rng(step)
        picked = mi_probe.sample_trajectory_turns(counts, self.cfg.num_samples, rng=rng)
        spans = [turns_of[trajectories[m]][t] for m, t in picked]
        prompts = [batch.input_ids[row, :start].tolist() for row, start, _ in spans]
        reasonings = [batch.input_ids[row, start:end].tolist() for row, start, end in spans]
        return prompts, reasonings, list(range(len(spans)))

    def state_dict(self) -> dict:
        return {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])


def _weights_dtype(policy) -> torch.dtype:
    param = next(iter(policy.parameters()), None)
    return param.dtype if param is not None else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16", as model.dtype spells it."""
    return str(dtype).removeprefix("torch.")


def reply_spans(turn_index: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(row, turn, start, end) of each turn's sampled tokens, from a [B, T] `turn_index` (the turn
    of a sampled token, -1 elsewhere); a sampled EOS belongs to its turn's reply."""
    spans = []
    for row, turns in enumerate(turn_index.tolist()):
        start = 0
        for turn, run in itertools.groupby(turns):
            end = start + len(list(run))
            if turn >= 0:
                spans.append((row, turn, start, end))
            start = end
    return spans


def usable_scores(scores):
    """The cross-scores the estimators can use: `(L, L_sum, owner, column_ids, rows dropped)`.

    A column with no finite entry goes first (one prompt the model scores NaN should not drop
    every row), then every row with a non-finite entry left, then the columns no remaining row
    owns; `owner` is renumbered onto the columns kept.
    """
    L, L_sum, owner = scores.L, scores.L_sum, scores.owner
    finite = torch.isfinite(L) & torch.isfinite(L_sum)
    columns = finite.any(dim=0) if L.shape[0] else torch.zeros(L.shape[1], dtype=torch.bool)
    rows = finite[:, columns].all(dim=1) & columns[owner]
    kept_cols = sorted(set(owner[rows].tolist()))
    index = torch.tensor(kept_cols, dtype=torch.long)
    renumber = {old: new for new, old in enumerate(kept_cols)}
    new_owner = torch.tensor([renumber[o] for o in owner[rows].tolist()], dtype=torch.long)
    return (L[rows][:, index], L_sum[rows][:, index], new_owner, [scores.column_ids[c] for c in kept_cols],
            int((~rows).sum()))


class CollapseWatch:
    """The collapse detector over a run's logged series, with alerts as run events."""

    def __init__(self, cfg: ProbeSection, total_steps: int | None = None):
        self.cfg = cfg
        self.total_steps = total_steps  # the run's length, to flag alerts on runs too short to judge
        self.detector = mi_probe.CollapseDetector(cfg.collapse)

    def observe(self, step: int, metrics: dict, log=None) -> tuple[dict, mi_probe.Alert | None]:
        """Feed one step's metrics; log each alert. Returns the `alert/...` metrics and the alert
        that asks to stop the run (probe.stop_on_collapse / stop_on_early_warning), or None: the
        trainer's stoppers decide whether the run stops on it (engines/local/stoppers)."""
        alerts = self.detector.update(step, **series_values(metrics))
        out: dict = {}
        for alert in alerts:
            out[f"alert/{alert.kind}"] = 1.0
            if log is not None:
                log.event("alert", alert=alert.kind, message=explain_alert(alert, self.cfg, self.total_steps),
                          step=step, numbers=alert.numbers)
        stopping = [a for a in alerts if (a.kind == "template_collapse" and self.cfg.stop_on_collapse)
                    or (a.kind in EARLY_WARNINGS and self.cfg.stop_on_early_warning)]
        return out, (stopping[0] if stopping else None)

    def state_dict(self) -> dict:
        return self.detector.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.detector.load_state_dict(state)


def series_values(metrics: dict) -> dict[str, float]:
    """The detector's inputs present in `metrics`; a non-finite value is dropped (the update
    already skipped it), except the gradient norm, where it is itself the alarm."""
    values = {}
    for name, keys in WATCHED_SERIES.items():
        value = next((metrics[key] for key in keys if key in metrics), None)
        if isinstance(value, str):  # the run log writes NaN/inf as strings
            try:
                value = float(value)
            except ValueError:
                continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if math.isfinite(value) or name == "grad_norm":
            values[name] = float(value)
    return values


# What each alert means, for its one printed line (the detector's message gives the numbers)
ALERT_WHY = {
    "reward_std_cliff": "the in-group reward spread fell, so fewer groups carry a learning signal",
    "grad_norm_spike": "one update's gradient norm far exceeded its recent ones",
    "template_collapse": "the MI probe says the output depends less on the input while entropy holds",
    "degeneration": "the policy repeats characters, tokens or phrases instead of answering (RAGEN #52's '!!!!!!')",
}
SHORT_RUN_FACTOR = 3  # a run shorter than this many x (baseline + patience) of a series is too short to judge it


def explain_alert(alert, cfg: ProbeSection, total_steps: int | None) -> str:
    """The alert's message, why it fired, and on a short run that one run of this length cannot
    tell a trend from noise (the detector's reference is then a handful of steps)."""
    line = f"{alert.message} ({ALERT_WHY.get(alert.kind, alert.kind)})"
    collapse = cfg.collapse
    needed = {"reward_std_cliff": collapse.reward_std_baseline + collapse.reward_std_patience,
              "grad_norm_spike": collapse.grad_norm_window + 1,
              "degeneration": collapse.degenerate_patience,
              "template_collapse": (collapse.mi_baseline + collapse.mi_patience) * max(cfg.every, 1)}.get(alert.kind)
    if total_steps is not None and needed is not None and total_steps < SHORT_RUN_FACTOR * needed:
        line += (f"; a run of only {total_steps} steps is too short to judge this (the alert rests on "
                 f"{needed} steps): a hint to look at, not a finding")
    return line
