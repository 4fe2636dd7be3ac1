"""The audit's verdicts, as explicit rules (tested with hand-built numbers in tests/ragen2/reports/test_audit.py),
and the settings of a model audit, whose advice they give (`--groups`, `--max-new-tokens`, …).

Two verdicts:

* `model_verdict(numbers)` for `ragen2 audit --model`: one probed batch of fresh rollouts.
* `run_verdict(summary)` for `ragen2 audit RUN_DIR`: the logged series of a run.

Both refuse to overclaim. A claim that the reasoning is *blind* to its input (template
collapse, low diversity) needs enough reasoning rows over enough prompts from a model that
mostly writes the format: with fewer, the verdict is "inconclusive" and says what to change.
A clear positive finding (retrieval well above chance) needs only enough rows, since it can
only come from reasoning that does depend on its prompt.

A probe over whole replies (`probe.segment=reply`, `--segment reply`) has a row for every
rollout, so the format rate does not select its sample; the sentences then say "replies".

What to change depends on what was run (`Setting`: env, think mode, turns, model): the bundled
135M model rarely closes a <think> block and gets no reward spread on multi-turn FrozenLake or
Sokoban in any setting tried (docs/evidence.md), so its advice is answer-only mode, whole replies
or a supervised warm start (docs/warm_start.md), never "more rollouts" or "think mode" again.

Degenerate replies (mi_probe.degeneration: a character, token or short n-gram repeated over most
of a reply, or a loop the token budget cut; RAGEN #52's "!!!!!!") are a finding of their own, not
one of the probe's: both verdicts keep their label and state it with the numbers when the share
reaches DEGENERATE_HIGH (a run: its own threshold, or its degeneration alarm fired); the model
verdict's explanation begins with it, the run verdict's line follows its key numbers.

Steps in every sentence here are 1-based (the console's "step 1/6"), i.e. metrics.jsonl's
0-based `step` field + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ragen2 import metric_names as names

RETRIEVAL_Z_CLEAR = 2.0  # retrieval above chance by this many binomial std errors: input-dependent
RETRIEVAL_Z_WEAK = 1.0
ENTROPY_FLOOR = 0.3  # nats/token: below it the sampled text is close to deterministic
MIN_ROWS = 16  # segments (reasoning or replies) the probe scored; below this no verdict at all
MIN_PROMPTS = 4  # distinct prompts (chance level 1/N); with 2-3 a lucky guess is likely
MIN_FORMAT_OK = 0.5  # share of well-formed turns needed before the reasoning is called blind
MIN_PROBES = 3  # logged probes a run needs before its trend means anything
NO_SPREAD = 1e-9  # in-group reward std at or below this: every rollout of a group scored the same
# share of degenerate replies the verdicts call out: the collapse detector's default degenerate_share
# (mi_probe.CollapseDetectorConfig; a run's own config.yaml value wins in the run verdict)
DEGENERATE_HIGH = 0.25
DEGENERATE_WHAT = "a character, token or short n-gram repeated over most of the reply, or a loop the token budget cut"

FORMAT_ADVICE = ("use a model that follows the <think>…</think><answer>…</answer> format, train the format "
                 "first (a few steps: the format penalty teaches it), or audit a trained checkpoint")
ROWS_ADVICE = "roll out more groups (--groups, --group-size) or raise --max-new-tokens so the reasoning closes"


BUNDLED_THINK = ("the bundled model rarely writes a well-formed think-mode reply (1 to 4 of 64 Bandit episodes, "
                 "docs/evidence.md)")
BUNDLED_MULTI_TURN = ("the bundled model gets no reward spread on multi-turn FrozenLake or Sokoban: every episode "
                      "of the 7 settings tried scored the same, -0.1 a turn (docs/evidence.md), so a bigger group "
                      "draws more of the same")


@dataclass(frozen=True)
class Setting:
    """What was run or audited, as far as it is known (None: not recorded), for advice that fits it."""

    env: str | None = None
    think: bool | None = None  # the env's require_think
    max_turns: int | None = None
    model: str | None = None

    @classmethod
    def of(cls, facts: dict) -> "Setting":
        """From a run summary's `config` or a model audit's numbers (keys env, think_mode, max_turns, model)."""
        turns = facts.get("max_turns")
        think = facts.get("think_mode")
        return cls(facts.get("env"), None if think is None else bool(think),
                   int(turns) if isinstance(turns, (int, float)) else None, facts.get("model"))

    @property
    def bundled(self) -> bool:
        if not isinstance(self.model, str):
            return False
        from ragen2.models import BUNDLED_NAMES  # torch: only when a verdict is given, never for --help

        return self.model.lower() in BUNDLED_NAMES

    @property
    def multi_turn(self) -> bool:
        return (self.max_turns or 1) > 1


def warm_start(setting: Setting, option: str) -> str:
    """The warm start's commands (docs/warm_start.md) for `setting`'s env and turns, demos in its own
    mode, ending in `option` (how the trained model is passed on: `--model` for train and audit)."""
    env = setting.env or "ENV"
    turns = f" rollout.max_turns={setting.max_turns}" if setting.multi_turn else ""
    reasoning = "grounded" if setting.think else "none"
    return (f"ragen2 demos --env {env} --reasoning {reasoning} --out demos.jsonl{turns}, ragen2 sft --demos "
            f"demos.jsonl trainer.run_name={env}-sft{turns}, then {option} runs/{env}-sft")


@dataclass
class AuditSettings:
    """What `ragen2 audit --model` rolls out and probes (its flags, with these defaults).

    Its own defaults rather than the env's training preset, kept on purpose: a verdict compares
    models under one fixed probe (first turn, 96 tokens), whatever preset each was trained with."""

    groups: int = 8
    group_size: int = 4
    max_turns: int = 1
    max_new_tokens: int = 96
    temperature: float = 1.0
    mode: str = "first_turn"
    segment: str = "reasoning"
    num_samples: int = 64
    seed: int = 0


def retrieval_zscore(accuracy: float, chance: float, rows: int) -> float:
    """How far accuracy@1 is above chance, in binomial standard errors of `rows` draws."""
    if rows <= 0 or not 0 < chance < 1:
        return float("nan")
    return (accuracy - chance) / math.sqrt(chance * (1 - chance) / rows)


def _get(numbers: dict, key: str, default=float("nan")) -> float:
    value = numbers.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def model_verdict(numbers: dict) -> tuple[str, str]:
    """(label, explanation) from `audit.audit_model`'s numbers: the probe's verdict (`probe_verdict`),
    its explanation led by the share of degenerate replies where that is at least DEGENERATE_HIGH
    (what the probe scored was then repetition, whatever the label says)."""
    label, explanation = probe_verdict(numbers)
    degenerate = _get(numbers, "degenerate_fraction")
    if not degenerate >= DEGENERATE_HIGH:  # NaN (an audit that did not count them) says nothing
        return label, explanation
    replies = int(_get(numbers, "num_replies", 0))
    count = f"{int(_get(numbers, 'degenerate_replies', 0))} of {replies} replies" if replies else "replies"
    example = numbers.get("degenerate_example")
    seen = f" (e.g. {example!r})" if isinstance(example, str) and example else ""
    return label, (f"degenerate replies: {count} ({degenerate:.2f}, at or above {DEGENERATE_HIGH:.2f}) are "
                   f"{DEGENERATE_WHAT}{seen}; the policy has degenerated (RAGEN #52). {explanation}")


def probe_verdict(numbers: dict) -> tuple[str, str]:
    """(label, explanation) from the probe's numbers alone. The rule, in order:

    1. fewer than MIN_ROWS reasoning rows or MIN_PROMPTS prompts: inconclusive (what to change);
    2. retrieval z >= RETRIEVAL_Z_CLEAR with MI > 0: input-dependent;
    3. format ok below MIN_FORMAT_OK: inconclusive (the few well-formed answers are no sample of
       the policy's reasoning);
    4. z in [RETRIEVAL_Z_WEAK, RETRIEVAL_Z_CLEAR) with MI > 0: weak input dependence;
    5. otherwise entropy >= ENTROPY_FLOOR: template collapse suspected, else low diversity.
    """
    rows = int(_get(numbers, "num_rows", 0))
    prompts = int(_get(numbers, "num_distinct_prompts", 0))
    format_ok = _get(numbers, "format_ok_fraction")
    replies = numbers.get("segment") == "reply"
    noun, subject = ("replies", "the reply") if replies else ("reasoning segments", "the reasoning")
    setting = Setting.of(numbers)
    if numbers.get("skipped_too_few_groups") or rows < MIN_ROWS or prompts < MIN_PROMPTS:
        if replies:
            why, advice = ("too few rollouts" if rows < MIN_ROWS else "too few distinct prompts"), ROWS_ADVICE
        elif rows >= MIN_ROWS:
            why, advice = "too few distinct prompts", ROWS_ADVICE
        else:
            why, advice = _few_reasoning_rows(setting)
        return ("inconclusive", f"only {rows} {noun} over {prompts} prompts (a verdict needs at least "
                                f"{MIN_ROWS} over {MIN_PROMPTS}): {why}. To get one: {advice}")
    accuracy, chance = _get(numbers, "retrieval_accuracy@1"), _get(numbers, "retrieval_chance_level@1")
    z = retrieval_zscore(accuracy, chance, rows)
    entropy, mi = _get(numbers, "policy_entropy"), _get(numbers, "mi_estimate")
    facts = (f"retrieval accuracy@1 {accuracy:.3f} vs chance {chance:.3f} (z = {z:.2f} over {rows} rows, "
             f"{prompts} prompts), MI {mi:.4f} nats, MI z-score {_get(numbers, 'mi_zscore'):.3f}, "
             f"policy entropy {entropy:.3f} nats/token, format ok {format_ok:.2f}")
    if z >= RETRIEVAL_Z_CLEAR and mi > 0:
        return "input-dependent", f"{subject} identifies its own prompt well above chance: {facts}"
    # Reasoning rows exist only where the format held; every reply is a row, whatever the format.
    if not replies and not format_ok >= MIN_FORMAT_OK:  # NaN too: unknown format rate is no basis for a negative claim
        advice = (f"{BUNDLED_THINK}: probe whole replies (--segment reply), or audit a warm-started model "
                  f"(docs/warm_start.md: {warm_start(setting, '--model')})" if setting.bundled else FORMAT_ADVICE)
        return ("inconclusive", f"only {format_ok:.2f} of turns were well-formed (a negative verdict needs "
                                f"{MIN_FORMAT_OK:.2f}): the scored reasoning is a small, selected sample. "
                                f"{advice[0].upper() + advice[1:]}. Numbers: {facts}")
    if z >= RETRIEVAL_Z_WEAK and mi > 0:
        return "weak input dependence", f"above chance, but not clearly ({ROWS_ADVICE}): {facts}"
    if entropy >= ENTROPY_FLOOR:
        return "template collapse suspected", f"{subject} varies but does not identify its input: {facts}"
    return "low diversity", f"near-deterministic output that does not identify its input: {facts}"


def _few_reasoning_rows(setting: Setting) -> tuple[str, str]:
    """(why, what to change) for a model audit of reasoning that scored too few rows: an answer-only
    env has none to score; the bundled model in think mode rarely closes one, whatever the budget."""
    if setting.think is False:
        think = "" if setting.bundled else ", or audit the env in think mode (leave out require_think=false)"
        return ("the env is answer-only (require_think=false), so there is no reasoning to score",
                f"probe whole replies (--segment reply; --segment auto picks them for an answer-only env){think}")
    why = "the model rarely closed a <think>…</think> block"
    if setting.bundled and setting.think:
        return why, (f"{BUNDLED_THINK}, so more rollouts or tokens will not help: probe whole replies "
                     f"(--segment reply), or audit a warm-started model (docs/warm_start.md: "
                     f"{warm_start(setting, '--model')})")
    if setting.think:
        return why, f"{ROWS_ADVICE}; {FORMAT_ADVICE}; or probe whole replies (--segment reply)"
    return why, (f"{ROWS_ADVICE}; {FORMAT_ADVICE}; use a think-mode env (e.g. --env bandit, not "
                 f"require_think=false), or probe whole replies (--segment reply)")  # mode not recorded


def compare_with_base(numbers: dict, base: dict) -> str:
    """One line: how the audited model differs from its base model on the same instances."""
    parts = []
    for label, key, digits in (("retrieval@1", "retrieval_accuracy@1", 3), ("MI", "mi_estimate", 4),
                               ("policy entropy", "policy_entropy", 3), ("format ok", "format_ok_fraction", 2),
                               ("success", "success_rate", 3), ("degenerate", "degenerate_fraction", 2)):
        now, before = _get(numbers, key), _get(base, key)
        if math.isfinite(now) and math.isfinite(before):
            parts.append(f"{label} {before:.{digits}f} -> {now:.{digits}f} ({now - before:+.{digits}f})")
    label, _ = model_verdict(base)
    return f"vs base model (verdict: {label}): " + (", ".join(parts) if parts else "no common numbers")


def _last(series: dict, key: str) -> dict | None:
    entry = series.get(key)
    return entry if isinstance(entry, dict) and entry.get("n") else None


def run_verdict(summary: dict) -> tuple[str, list[str]]:
    """(label, lines) for a run from `audit_report.summarise`'s summary. The rule, in order:

    * no reward spread (in-group reward std never above NO_SPREAD, or every step skipped): said
      plainly, since no step carried a task gradient;
    * no reasoning to probe (the probe never scored MIN_ROWS rows, or never ran): said plainly;
    * fewer than MIN_PROBES probes: inconclusive;
    * a template-collapse alert: "template collapse" with its step;
    * else "no collapse detected", with the first and last MI-ZScore-EMA and retrieval vs chance.
    The key numbers (format, reward spread, success, probes) come first either way, then, where the
    share of degenerate replies reached the alarm's threshold or the alarm fired, a line on them.
    """
    series, stats = summary.get("series", {}), summary.get("run_stats", {})
    replies = (summary.get("config", {}).get("probe") or {}).get("segment") == "reply"
    noun = "replies" if replies else "reasoning segments"
    lines, problems = [], []
    fmt, spread, success = (_last(series, k) for k in (names.ROLLOUT_FORMAT_OK_FRACTION,
                                                      names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN,
                                                      names.ROLLOUT_SUCCESS_RATE))
    numbers = [f"{summary.get('steps', 0)} steps"]
    if fmt:
        numbers.append(f"format ok {fmt['first']:.2f} -> {fmt['last']:.2f}")
    if success:
        numbers.append(f"success {success['first']:.2f} -> {success['last']:.2f}")
    if spread:
        numbers.append(f"in-group reward std max {spread['max']:.3f}")
    if stats.get("skipped_steps"):
        numbers.append(f"{stats['skipped_steps']} skipped step(s)")
    probes, rows_max = int(stats.get("probes", 0)), stats.get("probe_rows_max")
    numbers.append(f"{probes} probe(s)" + (f" of {noun}, at most {int(rows_max)} rows each" if rows_max else ""))
    lines.append("; ".join(numbers))
    if (degenerate := degeneration_line(summary)) is not None:
        lines.append(degenerate)
    setting = Setting.of(summary.get("config") or {})
    kinds = []  # what each problem asks to change (conclusive_change)
    if (spread is not None and spread["max"] <= NO_SPREAD) or (stats.get("skipped_steps") and
                                                               stats["skipped_steps"] == summary.get("steps")):
        problems.append("no reward spread: every group's rollouts scored the same at every step, so no step had "
                        f"a task gradient (only the regularisers moved the policy). {_spread_advice(setting)}")
        kinds.append("spread")
    if probes == 0 or not rows_max or rows_max < MIN_ROWS:
        got = "the probe never ran (set probe.every=1)" if probes == 0 else (
            f"the probe scored at most {int(rows_max or 0)} {noun} (needs {MIN_ROWS})")
        kinds.append("probe" if probes == 0 else "rows_reply" if replies else "rows_reasoning")
        if replies:
            problems.append(f"too few replies to probe: {got}. Roll out more groups per step (rollout.num_groups, "
                            f"rollout.group_size) and probe every step")
        else:
            problems.append(f"no reasoning to probe: {got}. {_reasoning_advice(setting)}")
    if problems:
        return "inconclusive", lines + problems + [conclusive_change(summary, kinds)]
    alerts = [a for a in summary.get("alerts", []) if a.get("kind") == "template_collapse"]
    if alerts:
        return "template collapse", lines + [f"template-collapse alert at step {a['step'] + 1}: {a['message']}"
                                             for a in alerts]
    ema = _last(series, names.PROBE_MI_ZSCORE_EMA)
    retrieval = _last(series, names.PROBE_RETRIEVAL_ACCURACY_AT_1)
    chance = _last(series, names.PROBE_RETRIEVAL_CHANCE_LEVEL_AT_1)
    trend = []
    if ema:
        trend.append(f"MI-ZScore-EMA {ema['first']:.2f} -> {ema['last']:.2f}")
    if retrieval and chance:
        trend.append(f"retrieval@1 last {retrieval['last']:.2f} vs chance {chance['last']:.2f}")
    if probes < MIN_PROBES:
        return "inconclusive", lines + [f"only {probes} probe(s) (a trend needs {MIN_PROBES}): run more steps with "
                                        "probe.every=1"] + trend + [conclusive_change(summary, ["probes"])]
    return "no collapse detected", lines + [", ".join(trend) or "probe series present, no collapse alert"]


def degeneration_line(summary: dict) -> str | None:
    """The run's degenerate replies (training and validation shares, the degeneration alerts' steps),
    when a share reached the alarm's threshold (the run's probe.collapse.degenerate_share) or the
    alarm fired; None otherwise, also for a run that predates the metric."""
    series = summary.get("series", {})
    collapse = ((summary.get("config") or {}).get("probe") or {}).get("collapse") or {}
    threshold = _get(collapse, "degenerate_share", DEGENERATE_HIGH)
    shares = [(label, entry) for label, key in (("training", names.ROLLOUT_DEGENERATE_FRACTION),
                                                ("validation", names.VAL_DEGENERATE_FRACTION))
              if (entry := _last(series, key)) is not None]
    steps = [a["step"] + 1 for a in summary.get("alerts", []) if a.get("kind") == "degeneration"]
    if not steps and not any(entry["max"] >= threshold for _, entry in shares):
        return None
    parts = [f"{label} up to {entry['max']:.2f} of a step's replies (last {entry['last']:.2f})"
             for label, entry in shares]
    alarm = f"; degeneration alert at step {', '.join(map(str, steps))}" if steps else ""
    return (f"degenerate replies ({DEGENERATE_WHAT}): {', '.join(parts) or 'share not logged'}, against the "
            f"alarm's threshold {threshold:.2f}{alarm}")


def _spread_advice(setting: Setting) -> str:
    """What gives a run reward spread, for what it was: more rollouts or a higher temperature, except
    where docs/evidence.md shows they give the bundled model none."""
    if setting.bundled and setting.multi_turn:
        return (f"More rollouts will not help here: {BUNDLED_MULTI_TURN}. Warm-start it on the env's expert "
                f"first (docs/warm_start.md): {warm_start(setting, 'train with --model')}")
    if setting.bundled and setting.think:
        return (f"In think mode nearly every reply draws the format penalty: {BUNDLED_THINK}. Train answer-only "
                "(--env-arg require_think=false, the CPU default)")
    return ("Raise rollout.group_size or rollout.temperature, or pick an env/mode the model can sometimes "
            "solve")


def _reasoning_advice(setting: Setting) -> str:
    """What gives the probe reasoning to score, for what the run was (no "train in think mode" to a
    run that did, nor to the bundled model, which rarely closes a <think> block)."""
    replies = "probe whole replies (probe.segment=reply), which have a row per rollout"
    if setting.think is False:
        think = "" if setting.bundled else "; or train in think mode (leave out require_think=false)"
        return f"The run was answer-only (require_think=false), so it wrote no reasoning: {replies}{think}"
    if setting.think and setting.bundled:
        return (f"Think mode was on, but {BUNDLED_THINK}: {replies}, or warm-start it on think-mode demos "
                f"(docs/warm_start.md: {warm_start(setting, 'train with --model')})")
    if setting.think:
        return f"Give the reasoning room (rollout.max_new_tokens) and probe every step; or {replies}"
    return ("Train in think mode (e.g. --env bandit; the CPU default is answer-only), give the reasoning room "
            f"(rollout.max_new_tokens), and probe every step; or {replies}")  # the run's mode was not recorded


def conclusive_change(summary: dict, kinds: list[str]) -> str:
    """One line: the single setting that would make an inconclusive run conclusive, or, where one
    is not enough, every one it takes (the run's own sizes give the numbers)."""
    steps = int(summary.get("steps") or 0)
    config = summary.get("config") or {}
    probe, rollout = config.get("probe") or {}, config.get("rollout") or {}
    setting = Setting.of(config)
    changes = []
    for kind in kinds:
        if kind == "spread" and setting.bundled and setting.multi_turn:  # no group size gives it spread
            changes.append(f"--model runs/{setting.env or 'ENV'}-sft (the warm start above: ragen2 demos, then "
                           "ragen2 sft; docs/warm_start.md)")
        elif kind == "spread" and setting.bundled and setting.think:
            changes.append("--env-arg require_think=false (answer-only: the bundled model rarely closes <think>)")
        elif kind == "spread":
            changes.append(f"rollout.group_size={2 * int(rollout.get('group_size') or 4)} (more rollouts per prompt, "
                           "so that some of a group's differ)")
        elif kind == "probe":
            changes.append("probe.every=1")
        elif kind == "rows_reasoning":
            changes.append("probe.segment=reply (a row for every rollout, not only closed <think> blocks)")
        elif kind == "rows_reply":
            if int(probe.get("num_samples") or MIN_ROWS) < MIN_ROWS:
                changes.append(f"probe.num_samples={MIN_ROWS}")
            else:
                group = int(rollout.get("group_size") or 4)
                changes.append(f"rollout.num_groups={math.ceil(MIN_ROWS / group)} ({MIN_ROWS} rollouts per probe)")
        elif kind == "probes":
            every = max(1, (steps - 1) // (MIN_PROBES - 1))
            changes.append(f"probe.every={every} ({math.ceil(steps / every)} probes in {steps} steps)"
                           if steps >= MIN_PROBES else f"trainer.total_steps={MIN_PROBES} with probe.every=1")
    if len(changes) == 1:
        return f"One change would make it conclusive: rerun with {changes[0]}."
    return "No single change would make it conclusive; rerun with all of: " + "; ".join(changes) + "."
