"""Wires `mi_probe` into training: every `probe.every` steps, on the batch before filtering,
score each first-turn reasoning under every group's first prompt (first-turn mode).

The probe draws its subsample from its own RNG keyed by (step), never from the training
generator, so turning it on or off does not change the training trajectory.
"""

from __future__ import annotations

import time

import numpy as np

import mi_probe
from ragen2.config import ProbeSection

THINK_OPEN = "<think>"


class Probe:
    def __init__(self, cfg: ProbeSection, tokenizer):
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
        prompts, reasonings, owners = self.first_turn_pairs(batch, step)
        if len(set(owners)) < 2:
            return {"probe/skipped_too_few_groups": 1.0, "probe/time_s": time.perf_counter() - started}
        scores = mi_probe.cross_score(policy, prompts, reasonings, owners, pad_token_id=self.pad_id)
        metrics = mi_probe.mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids)
        metrics.update(self.ema.update(metrics))
        metrics["num_empty_dropped"] = float(scores.num_empty_dropped)
        out = {f"probe/{key}": float(value) for key, value in metrics.items()}
        out["probe/time_s"] = time.perf_counter() - started
        return out

    def first_turn_pairs(self, batch, step: int):
        """Columns: each group's first prompt + `<think>`; rows: first-turn reasoning segments."""
        group_of_row = batch.group_ids.tolist()
        first_sampled = batch.response_mask.float().argmax(dim=1).tolist()
        prompt_of_group: dict[int, list[int]] = {}
        for row, group in enumerate(group_of_row):
            if group not in prompt_of_group:
                prompt = batch.input_ids[row, :first_sampled[row]].tolist()
                # The rollout usually prefills "<think>" already (RAGEN's layout).
                tail = self.tokenizer.decode(prompt[-8:], skip_special_tokens=False)
                prompt_of_group[group] = prompt if tail.endswith(THINK_OPEN) else prompt + self.think_ids
        groups = sorted(prompt_of_group)
        column = {group: index for index, group in enumerate(groups)}
        spans = [(row, start, end) for row, turn, start, end in batch.reasoning_spans if turn == 0 and end > start]
        rng = np.random.default_rng([step, 0x9B0BE])
        if len(spans) > self.cfg.num_samples:
            picked = sorted(rng.choice(len(spans), size=self.cfg.num_samples, replace=False).tolist())
            spans = [spans[i] for i in picked]
        reasonings = [batch.input_ids[row, start:end].tolist() for row, start, end in spans]
        owners = [column[group_of_row[row]] for row, _, _ in spans]
        return [prompt_of_group[g] for g in groups], reasonings, owners

    def state_dict(self) -> dict:
        return {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
