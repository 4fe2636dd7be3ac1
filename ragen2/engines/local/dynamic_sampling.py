"""DAPO's dynamic sampling in the local engine (filter.max_rounds > 1; the dapo-dynamic preset).

Round 0 rolls out the step's own instances (seeding.step_seeds), as every arm of a comparison does.
While fewer than rollout.num_groups groups with spread were found, round r >= 1 rolls out as many
groups again from seeding.refill_seeds, a stream of their own (round 0 stays paired across arms), up
to filter.max_rounds rounds. snr.Refill picks each round's groups with the filter's own spread
function on its signal; the filter then ranks the groups found. When the rounds run out first, an
event says so and the step trains on what was found, or the filter skips it when nothing was (the
stop policy counts that skip like any other). With max_rounds 1 this is the step's one rollout.

The budget is logged every step, whatever the filter: sampling/rounds, sampling/episodes and
sampling/tokens count every round (the bench's env_episodes and sampled_tokens); rollout/* describe
round 0, the instances every arm meets, so the training reward stays comparable across arms.
"""

from __future__ import annotations

from dataclasses import dataclass

import snr
from ragen2 import metric_names as names
from ragen2.engines.local.run import Run
from ragen2.rollout.agent_loop import rollout  # the module itself: the package re-exports it lazily
from ragen2.rollout.batch import RolloutBatch
from ragen2.seeding import refill_seeds, step_seeds

LIMIT_EVENT = "dynamic_sampling_limit"


@dataclass
class Sampled:
    """One step's sampling: `batch` is what the filter ranks, `rounds` every round's rollout."""

    batch: RolloutBatch
    rounds: list[RolloutBatch]
    refill: snr.Refill | None = None  # None: one round, no dynamic sampling

    @property
    def first(self) -> RolloutBatch:
        return self.rounds[0]


def sample(run: Run) -> Sampled:
    """The step's rollouts: one round, or DAPO's rounds until the batch holds num_groups groups with
    spread or filter.max_rounds rounds were sampled. Moves only the sampling generator."""
    cfg, state, services = run.cfg, run.state, run.services

    def one_round(index: int) -> RolloutBatch:
        seeds = step_seeds(cfg, state.step) if index == 0 else refill_seeds(cfg, state.step, index)
        return rollout(services.models.policy, services.models.tokenizer, services.make_env, seeds, cfg.rollout,
                       state.generator, progress=services.live.rollout("rollout" if index == 0 else f"refill {index}"))

    first = one_round(0)
    if cfg.filter.max_rounds == 1:
        return Sampled(first, [first])
    refill = snr.Refill(cfg.filter, cfg.rollout.num_groups)
    rounds, pieces = [], []
    while not refill.done:
        batch = one_round(len(rounds)) if rounds else first
        rounds.append(batch)
        signal = None if cfg.filter.signal == "reward" else batch.signal_matrix(cfg.filter.signal)
        taken = refill.add(batch.reward_matrix(), signal)
        if taken:
            pieces.append(batch.select_groups(taken))
    # nothing found: round 0 goes to the filter, whose include_zero false keeps none of it (a skip)
    batch = RolloutBatch.concat(pieces) if pieces else first
    return Sampled(batch, rounds, refill)


def report(run: Run, sampled: Sampled) -> dict:
    """rollout/* of round 0 and the step's sampling budget; the event when the round limit ended
    sampling before the batch was full."""
    metrics = sampled.first.metrics()
    metrics[names.SAMPLING_ROUNDS] = float(len(sampled.rounds))
    metrics[names.SAMPLING_EPISODES] = float(sum(len(b.trajectories) for b in sampled.rounds))
    metrics[names.SAMPLING_TOKENS] = float(sum(sum(t.response_lengths) for b in sampled.rounds
                                               for t in b.trajectories))
    refill = sampled.refill
    metrics[names.SAMPLING_ROUND_LIMIT] = float(refill is not None and refill.exhausted)
    if refill is None:
        return metrics
    metrics["sampling/groups_found"] = float(refill.found)  # groups with spread taken into the batch
    metrics["sampling/flat_groups"] = float(refill.flat)  # groups sampled without spread (dropped)
    if refill.exhausted:
        step, cfg = run.state.step, run.cfg
        outcome = (f"training on {refill.found}" if refill.found else
                   "no update this step (the filter skips it; stop.max_consecutive_skips counts it)")
        run.services.log.event(
            LIMIT_EVENT, step=step, rounds=refill.rounds, found=refill.found, wanted=refill.num_groups,
            message=f"step {step}: dynamic sampling found {refill.found} of {refill.num_groups} groups with spread in "
                    f"{cfg.filter.signal} after {refill.rounds} rounds (filter.max_rounds={cfg.filter.max_rounds}): "
                    f"{outcome}")
    return metrics
