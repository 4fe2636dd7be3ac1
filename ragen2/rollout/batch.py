"""RolloutBatch: the tensors a trainer needs from one rollout, plus per-trajectory logs.

Rows and trajectories: in full-history mode each trajectory is one row (traj_index = arange).
In window mode each turn is its own row, so one trajectory spans several rows; traj_index maps
a row to its trajectory, and the per-trajectory lists are indexed by trajectory.

Token tensors are [B, T], right-padded (pad id in input_ids, 0 in attention_mask):
  response_mask      1.0 on tokens the policy sampled (an EOS it sampled included), else 0.0
  sampling_logprobs  the sampler's log-prob of each sampled token, 0 elsewhere
  turn_index         0-based turn of a sampled token, -1 elsewhere
  token_rewards      the trajectory reward on the row's last sampled token, 0 elsewhere
  turn_rewards       each turn's reward (its format penalty included) on that turn's last
                     sampled token, 0 elsewhere
reasoning_spans: (row, turn, start, end) with input_ids[row, :start] the prompt x (ending with
the `<think>` tokens) and input_ids[row, start:end] the reasoning z (see chat.reasoning_span).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

import snr
from mi_probe.degeneration import degenerate_fraction

from ragen2 import metric_names as names

# What to do when the kept rows are not a multiple of RAGEN-2's size divisor. copy (RAGEN-2's
# batch_adjust_mode default): duplicate random rows up to the next multiple; delete: remove the
# remainder at random; none (ours): train on them as they are, the last mini-batch shorter.
BATCH_ADJUST_MODES = ("none", "copy", "delete")

# The per-episode numbers of a TrajectoryRecord the filter's spread can be measured on
# (FilterConfig.signal): the reward as trained, or the outcome (and the other flag an episode has).
EPISODE_SIGNALS = ("reward", "success", "context_truncated")


def ragen_size_divisor(num_groups: int, mini_batch_size: int, gpus: int = 1) -> int:
    """RAGEN-2's divisor: lcm(env groups per step, PPO mini-batch size, GPUs per node)."""
    return math.lcm(num_groups, mini_batch_size, gpus)


def adjusted_rows(rows: int, divisor: int, mode: str, generator: torch.Generator | None = None) -> list[int]:
    """Row indices after RAGEN-2's adjust_batch: all rows in order, then (copy) divisor - remainder
    random rows again, drawn without replacement unless more are needed than there are rows;
    or (delete) all rows but `remainder` random ones, in order. RAGEN-2 draws from numpy's global
    RNG; here `generator` (the run's) keeps a seeded run reproducible."""
    if mode not in BATCH_ADJUST_MODES:
        raise ValueError(f"batch adjust mode must be one of {list(BATCH_ADJUST_MODES)}, got {mode!r}")
    if divisor < 1:
        raise ValueError(f"divisor must be >= 1, got {divisor}")
    remainder = rows % divisor
    if mode == "none" or remainder == 0:
        return list(range(rows))
    if mode == "delete":  # rows < divisor deletes them all, as RAGEN-2's would
        dropped = set(torch.randperm(rows, generator=generator)[:remainder].tolist())
        return [r for r in range(rows) if r not in dropped]
    to_add = divisor - remainder
    if to_add > rows:
        extra = torch.randint(rows, (to_add,), generator=generator).tolist()
    else:
        extra = torch.randperm(rows, generator=generator)[:to_add].tolist()
    return list(range(rows)) + extra


@dataclass
class RowRecord:
    """One training row before padding."""

    traj: int
    input_ids: list[int]
    sampled: list[bool]
    logprobs: list[float]
    turn_index: list[int]
    turn_ends: list[tuple[int, int]]  # (turn, index of that turn's last sampled token)
    reasoning: list[tuple[int, int, int]] = field(default_factory=list)  # (turn, start, end)


@dataclass
class TrajectoryRecord:
    """What one env episode produced, turn by turn."""

    group: int
    member: int
    seed: int
    turn_rewards: list[float] = field(default_factory=list)
    response_texts: list[str] = field(default_factory=list)
    parse_errors: list[str | None] = field(default_factory=list)
    format_ok: list[bool] = field(default_factory=list)
    think_lengths: list[int] = field(default_factory=list)  # tokens; 0 where no reasoning span
    response_lengths: list[int] = field(default_factory=list)  # sampled tokens per turn
    finish_reasons: list[str] = field(default_factory=list)
    # For reading what the model did (completions.jsonl), not for training: the env's state text
    # before each turn plus the one after the last, and per turn the actions parsed / executed.
    observations: list[str] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)  # {"parsed", "executed", "num_invalid"} per turn
    success: bool = False
    context_truncated: bool = False

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))


def _pad(rows: list[list], width: int, value) -> list[list]:
    return [row + [value] * (width - len(row)) for row in rows]


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    turn_index: torch.Tensor
    token_rewards: torch.Tensor
    turn_rewards: torch.Tensor
    traj_rewards: torch.Tensor  # [B] the row's trajectory reward
    group_ids: torch.Tensor  # [B] the prompt group (0..P-1 before any selection)
    traj_index: torch.Tensor  # [B] row -> trajectory
    success: torch.Tensor  # [B] bool
    num_turns: torch.Tensor  # [B]
    context_truncated: torch.Tensor  # [B] bool: ended because the next prompt would not fit
    trajectories: list[TrajectoryRecord]
    reasoning_spans: list[tuple[int, int, int, int]]
    group_size: int

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def from_records(cls, rows: list[RowRecord], trajectories: list[TrajectoryRecord], *,
                     pad_token_id: int, group_size: int) -> "RolloutBatch":
        if not rows:
            raise ValueError("a RolloutBatch needs at least one row")
        width = max(len(r.input_ids) for r in rows)
        lengths = [len(r.input_ids) for r in rows]
        input_ids = torch.tensor(_pad([r.input_ids for r in rows], width, pad_token_id), dtype=torch.long)
        attention_mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long)
        response_mask = torch.tensor(_pad([[float(s) for s in r.sampled] for r in rows], width, 0.0))
        logprobs = torch.tensor(_pad([[lp if s else 0.0 for lp, s in zip(r.logprobs, r.sampled)] for r in rows],
                                     width, 0.0), dtype=torch.float32)
        turn_index = torch.tensor(_pad([r.turn_index for r in rows], width, -1), dtype=torch.long)
        token_rewards = torch.zeros(len(rows), width)
        turn_rewards = torch.zeros(len(rows), width)
        for b, row in enumerate(rows):
            traj = trajectories[row.traj]
            if row.turn_ends:
                token_rewards[b, max(end for _, end in row.turn_ends)] = traj.reward
            for turn, end in row.turn_ends:
                turn_rewards[b, end] = traj.turn_rewards[turn]
        spans = [(b, turn, start, end) for b, row in enumerate(rows) for turn, start, end in row.reasoning]
        per_row = [trajectories[r.traj] for r in rows]
        return cls(
            input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
            sampling_logprobs=logprobs, turn_index=turn_index, token_rewards=token_rewards,
            turn_rewards=turn_rewards,
            traj_rewards=torch.tensor([t.reward for t in per_row], dtype=torch.float32),
            group_ids=torch.tensor([t.group for t in per_row], dtype=torch.long),
            traj_index=torch.tensor([r.traj for r in rows], dtype=torch.long),
            success=torch.tensor([t.success for t in per_row], dtype=torch.bool),
            num_turns=torch.tensor([len(t.turn_rewards) for t in per_row], dtype=torch.long),
            context_truncated=torch.tensor([t.context_truncated for t in per_row], dtype=torch.bool),
            trajectories=trajectories, reasoning_spans=spans, group_size=group_size,
        )

    # --- views -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-pad) tokens in the batch."""
        return int(self.attention_mask.sum())

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    def _tensor_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    def to(self, device) -> "RolloutBatch":
        moved = {name: getattr(self, name).to(device) for name in self._tensor_fields()}
        return dataclasses.replace(self, **moved)

    def select_groups(self, kept_group_indices) -> "RolloutBatch":
        """The rows of the kept groups, whole groups in their original order (trajectories renumbered)."""
        kept = {int(g) for g in kept_group_indices}
        present = {t.group for t in self.trajectories}
        unknown = sorted(kept - present)
        if unknown:
            raise ValueError(f"select_groups: groups {unknown} are not in this batch (groups: {sorted(present)})")
        kept_trajs = [i for i, t in enumerate(self.trajectories) if t.group in kept]
        new_traj = {old: new for new, old in enumerate(kept_trajs)}
        row_keep = [b for b in range(len(self)) if int(self.group_ids[b]) in kept]
        new_row = {old: new for new, old in enumerate(row_keep)}
        index = torch.tensor(row_keep, dtype=torch.long, device=self.input_ids.device)
        moved = {name: getattr(self, name).index_select(0, index) for name in self._tensor_fields()}
        moved["traj_index"] = torch.tensor([new_traj[int(t)] for t in moved["traj_index"].tolist()],
                                           dtype=torch.long, device=self.input_ids.device)
        if row_keep:  # drop columns that were only padding for the dropped rows
            width = int(moved["attention_mask"].sum(-1).max())
            moved = {k: (v[:, :width] if v.dim() == 2 else v) for k, v in moved.items()}
        spans = [(new_row[b], turn, s, e) for b, turn, s, e in self.reasoning_spans if b in new_row]
        return dataclasses.replace(self, **moved, trajectories=[self.trajectories[i] for i in kept_trajs],
                                   reasoning_spans=spans)

    def take_rows(self, order: list[int]) -> "RolloutBatch":
        """The rows at `order` (repeats allowed: a copy keeps its group, trajectory and spans;
        the per-trajectory logs are unchanged, so metrics still count each episode once)."""
        index = torch.tensor(order, dtype=torch.long, device=self.input_ids.device)
        moved = {name: getattr(self, name).index_select(0, index) for name in self._tensor_fields()}
        spans_of: dict[int, list] = {}
        for b, turn, start, end in self.reasoning_spans:
            spans_of.setdefault(b, []).append((turn, start, end))
        spans = [(new, *span) for new, old in enumerate(order) for span in spans_of.get(old, ())]
        return dataclasses.replace(self, **moved, reasoning_spans=spans)

    @classmethod
    def concat(cls, batches: list["RolloutBatch"]) -> "RolloutBatch":
        """One batch of several rollouts' rows (dynamic sampling's rounds), in order. Groups are
        renumbered 0, 1, ... in order of appearance, so groups of different rounds never share an
        id; rows are right-padded to the widest (input_ids with a pad id the batches already use)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("concat needs at least one batch with rows")
        if len({b.group_size for b in batches}) > 1:
            raise ValueError(f"concat: group sizes differ ({sorted({b.group_size for b in batches})})")
        width = max(b.input_ids.shape[1] for b in batches)
        pads = [b.input_ids[b.attention_mask == 0] for b in batches]
        fills = {"input_ids": next((int(p[0]) for p in pads if p.numel()), 0), "turn_index": -1}
        parts: dict[str, list[torch.Tensor]] = {}
        trajectories, spans, groups = [], [], 0
        for b in batches:
            renumber: dict[int, int] = {}
            for t in b.trajectories:
                renumber.setdefault(t.group, groups + len(renumber))
            for name in b._tensor_fields():
                value = getattr(b, name)
                if name == "group_ids":
                    value = torch.tensor([renumber[g] for g in value.tolist()], dtype=torch.long, device=value.device)
                elif name == "traj_index":
                    value = value + len(trajectories)
                elif value.dim() == 2:
                    value = torch.nn.functional.pad(value, (0, width - value.shape[1]), value=fills.get(name, 0))
                parts.setdefault(name, []).append(value)
            rows = sum(len(v) for v in parts["input_ids"][:-1])
            spans += [(rows + row, turn, start, end) for row, turn, start, end in b.reasoning_spans]
            trajectories += [dataclasses.replace(t, group=renumber[t.group]) for t in b.trajectories]
            groups += len(renumber)
        return dataclasses.replace(batches[0], **{name: torch.cat(values) for name, values in parts.items()},
                                   trajectories=trajectories, reasoning_spans=spans)

    # --- metrics -----------------------------------------------------------------------------

    def grouped_rewards(self) -> dict[int, list[float]]:
        """Trajectory rewards per group id, each group's in member order."""
        groups: dict[int, list[tuple[int, float]]] = {}
        for t in self.trajectories:
            groups.setdefault(t.group, []).append((t.member, t.reward))
        return {g: [reward for _, reward in sorted(members)] for g, members in groups.items()}

    def reward_matrix(self) -> torch.Tensor:
        """[P, G] float64 trajectory rewards, group-major (row = group id, column = member): what
        the filter ranks. A group id with no trajectory (a selected batch) is a row of zeros."""
        num_groups = 1 + max(t.group for t in self.trajectories)
        rewards = torch.zeros(num_groups, self.group_size, dtype=torch.float64)
        for t in self.trajectories:
            rewards[t.group, t.member] = t.reward
        return rewards

    def signal_matrix(self, signal: str) -> torch.Tensor:
        """reward_matrix's layout for a per-episode field of EPISODE_SIGNALS (success: 1.0 / 0.0)."""
        if signal not in EPISODE_SIGNALS:
            raise ValueError(f"filter signal {signal!r} is no per-episode field of this engine's episodes; "
                             f"valid: {', '.join(EPISODE_SIGNALS)}")
        values = torch.zeros(1 + max(t.group for t in self.trajectories), self.group_size, dtype=torch.float64)
        for t in self.trajectories:
            values[t.group, t.member] = float(getattr(t, signal))
        return values

    def metrics(self, prefix: str = names.ROLLOUT, ddof: int = 1) -> dict[str, float]:
        """Summary numbers over trajectories (not rows) and over turns.

        In-group std and variance are snr.group_spread's with `ddof` (1 = torch.std's, snr's
        default); groups of one member contribute 0. reward_std is over all trajectories (ddof=0).
        """
        trajs = self.trajectories
        if not trajs:
            return {f"{prefix}num_trajectories": 0.0}
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
        groups = self.grouped_rewards()
        group_var = snr.group_spread(list(groups.values()), ddof)[0].tolist()
        turns = [(t, k) for t in trajs for k in range(len(t.turn_rewards))]
        thinks = [t.think_lengths[k] for t, k in turns if t.think_lengths[k] > 0]
        finish = [t.finish_reasons[k] for t, k in turns]

        def mean(values) -> float:
            return float(sum(values) / len(values)) if values else 0.0

        out = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "in_group_reward_std_mean": mean([v ** 0.5 for v in group_var]),
            "in_group_reward_variance_mean": mean(group_var),
            "success_rate": mean([float(t.success) for t in trajs]),
            "turns_mean": mean([len(t.turn_rewards) for t in trajs]),
            "response_tokens_mean": mean([sum(t.response_lengths) for t in trajs]),
            "response_tokens_per_turn_mean": mean([t.response_lengths[k] for t, k in turns]),
            "think_tokens_mean": mean(thinks),
            "think_span_fraction": len(thinks) / len(turns) if turns else 0.0,
            "format_ok_fraction": mean([float(t.format_ok[k]) for t, k in turns]),
            "finish_length_fraction": mean([float(r == "length") for r in finish]),
            "degenerate_fraction": degenerate_fraction(pair for t in trajs for pair in zip(t.response_texts,
                                                                                          t.finish_reasons)),
            "context_truncated": float(sum(t.context_truncated for t in trajs)),
            "num_trajectories": float(len(trajs)),
            "num_groups": float(len(groups)),
            "num_rows": float(len(self)),
            "num_tokens": float(self.num_tokens),
        }
        return {prefix + k: v for k, v in out.items()}
