"""The metric names one module writes and another reads, each defined once.

A step's row in metrics.jsonl is a flat dict keyed by these names. The writers (the rollout
batch, the local engine's trainer and learner, the probe, the OpenRLHF engine) and the readers
(run_dir's summary and step line, the reports and audits, the bench report and plots, the
collapse watch) import the constant, so a rename reaches both sides. A name written and never
read back by code stays a literal where it is written.

Some names are composed where they are written: RolloutBatch.metrics writes its fields under
the prefix its caller picks (ROLLOUT, VAL), the probe writes mi_probe's estimator keys under
PROBE, the gradient decomposition writes under GRAD, the trainer's timer under phase_seconds.
`snr` and `mi_probe` import nothing of ragen2, so they spell their names (`snr/...`, the
estimator keys) themselves. tests/ragen2/test_metric_names.py checks that a tiny training run
writes every name below, so a rename on the writing side fails there, and that no module of
ragen2 spells a name defined here as a literal of its own.

The values are fixed: runs committed under docs/experiments/ are read by these names.
"""

from __future__ import annotations

# -- prefixes -------------------------------------------------------------------------------
ROLLOUT = "rollout/"  # the training rollout's batch (RolloutBatch.metrics), before the filter
VAL = "val/"  # the validation rollout (agent_loop.evaluate; the OpenRLHF engine's eval rows)
PROBE = "probe/"  # the MI probe (instruments.probe.Probe.measure; the OpenRLHF scoring)
OPENRLHF = "openrlhf/"  # OpenRLHF's own logs, as its run files copy them
GRAD = "grad"  # gradient decomposition of the update's batch: GRAD/<bucket>/<key>
GRAD_PREFILTER = "grad_prefilter"  # the same, of the batch before the filter (probe.grad_prefilter)

# -- the rollout's batch: RolloutBatch.metrics, under the prefix its caller picks -------------
ROLLOUT_REWARD_MEAN = "rollout/reward_mean"  # mean summed reward of a trajectory
ROLLOUT_SUCCESS_RATE = "rollout/success_rate"  # share of trajectories that succeeded (terminated, not truncated)
ROLLOUT_FORMAT_OK_FRACTION = "rollout/format_ok_fraction"  # share of turns whose reply parsed to valid actions
ROLLOUT_IN_GROUP_REWARD_STD_MEAN = "rollout/in_group_reward_std_mean"  # mean over groups of the in-group reward std
ROLLOUT_RESPONSE_TOKENS_MEAN = "rollout/response_tokens_mean"  # sampled tokens per trajectory, all turns
ROLLOUT_THINK_TOKENS_MEAN = "rollout/think_tokens_mean"  # tokens inside <think> per turn that closed it
ROLLOUT_THINK_SPAN_FRACTION = "rollout/think_span_fraction"  # share of turns with a closed <think> span
ROLLOUT_NUM_TRAJECTORIES = "rollout/num_trajectories"  # trajectories (episodes) in the batch
ROLLOUT_NUM_TOKENS = "rollout/num_tokens"  # tokens of the batch's rows, prompts included
# share of replies (turns) that are degenerate: a character, token or short n-gram repeated over
# most of the reply, or a loop the token budget cut (mi_probe.degeneration); the collapse watch reads it
ROLLOUT_DEGENERATE_FRACTION = "rollout/degenerate_fraction"

# the same fields of the validation rollout (agent_loop.evaluate)
VAL_REWARD_MEAN = "val/reward_mean"  # also the OpenRLHF engine's mean evaluation reward
VAL_SUCCESS_RATE = "val/success_rate"  # share of validation episodes that succeeded
VAL_FORMAT_OK_FRACTION = "val/format_ok_fraction"  # share of validation turns that parsed to valid actions
VAL_NUM_GROUPS = "val/num_groups"  # validation groups (initial states)
VAL_PASS_AT = VAL + "pass@"  # + G: share of validation groups with at least one success
VAL_SPREAD_SHARE = "val/spread_share"  # share of validation groups whose episode rewards are not all equal
VAL_VALID_ACTION_SHARE = "val/valid_action_share"  # share of validation turns with no format penalty (every action valid)
VAL_DEGENERATE_FRACTION = "val/degenerate_fraction"  # share of validation replies that are degenerate (as rollout/)


def val_pass_at(group_size: int) -> str:
    """pass@G of validation, G the group size."""
    return f"{VAL_PASS_AT}{group_size}"


# -- a training step's sampling, every generation round (local engine: engines/local/dynamic_sampling);
# the bench's rollout budgets. rollout/* describe the step's first round only
SAMPLING_ROUNDS = "sampling/rounds"  # generation rounds (1 unless filter.max_rounds > 1: dynamic sampling)
SAMPLING_EPISODES = "sampling/episodes"  # training episodes rolled out, every round
SAMPLING_TOKENS = "sampling/tokens"  # tokens the policy sampled, every round
SAMPLING_ROUND_LIMIT = "sampling/round_limit"  # 1.0 when filter.max_rounds ended sampling before the batch was full


# -- phase times (local engine's trainer.Timer), seconds ------------------------------------
# the trainer times each phase under its name; time/<phase>_s is the row's key
PHASE_ROLLOUT = "rollout"
PHASE_OLD_LOG_PROBS = "old_log_probs"
PHASE_REF_LOG_PROBS = "ref_log_probs"
PHASE_VALUES = "values"
PHASE_ADVANTAGES = "advantages"
PHASE_FILTER = "filter"  # the SNR filter's selection
PHASE_UPDATE = "update"
TIME = "time/"  # every key under it is a wall time in seconds


def phase_seconds(phase: str) -> str:
    """Wall seconds a step spent in `phase`."""
    return f"{TIME}{phase}_s"


TIME_ROLLOUT_S = phase_seconds(PHASE_ROLLOUT)  # sampling the step's episodes
TIME_OLD_LOG_PROBS_S = phase_seconds(PHASE_OLD_LOG_PROBS)  # the rollout policy's log-probs of the kept rows
TIME_REF_LOG_PROBS_S = phase_seconds(PHASE_REF_LOG_PROBS)  # the reference model's (with a KL term)
TIME_VALUES_S = phase_seconds(PHASE_VALUES)  # the critic's values (PPO)
TIME_FILTER_S = phase_seconds(PHASE_FILTER)  # ranking and selecting groups
TIME_UPDATE_S = phase_seconds(PHASE_UPDATE)  # the PPO epochs' forward, backward and optimiser steps
TIME_VALIDATION_S = "time/validation_s"  # validation's wall seconds, on the steps that validate
TIME_STEP_S = "time/step_s"  # the whole step's wall seconds, validation included
PROBE_TIME_S = "probe/time_s"  # the MI probe's wall seconds
GRAD_TIME_S = "grad/time_s"  # the gradient decomposition's wall seconds (written as f"{GRAD}/time_s")
GRAD_PREFILTER_TIME_S = "grad_prefilter/time_s"  # the same, of the unfiltered batch

# -- update (local engine) ------------------------------------------------------------------
UPDATE_TOKENS = "update/tokens"  # tokens the update passed over (rows' tokens x PPO epochs); 0 when skipped
UPDATE_ROWS = "batch/update_rows"  # rows the update trained on (the kept groups' episodes)
THROUGHPUT_ROLLOUT = "throughput/rollout_tokens_per_s"  # sampled tokens per second of rollout
THROUGHPUT_UPDATE = "throughput/update_tokens_per_s"  # update tokens per second of the update phase
UPDATE_OPTIMIZER_STEPS = "update/optimizer_steps"  # optimiser steps taken (non-finite ones not counted)
ACTOR_PG_LOSS = "actor/pg_loss"  # the policy-gradient (task) loss term
ACTOR_ENTROPY = "actor/entropy"  # policy token entropy over the update's response tokens (nats/token)
ACTOR_GRAD_NORM = "actor/grad_norm"  # policy gradient norm before clipping
ACTOR_KL_LOSS = "actor/kl_loss"  # the KL-to-reference loss term (only with algo.kl_mode=loss)
# mini-batches not stepped because a gradient was not finite
ACTOR_NONFINITE_SKIPPED_MINIBATCHES = "actor/nonfinite_skipped_minibatches"
CRITIC_VALUE_LOSS = "critic/value_loss"  # the clipped value loss (PPO's critic)
CRITIC_CLIPFRAC = "critic/clipfrac"  # share of response tokens where the value clip binds
CRITIC_GRAD_NORM = "critic/grad_norm"  # critic gradient norm before clipping
UPDATE_KL_TO_REF = "update/kl_to_ref"  # KL(rollout policy || reference) over the update's tokens; 0 without one

# -- the SNR filter (spelled by snr.selection's metrics) -------------------------------------
SNR_SKIPPED = "snr/skipped"  # 1.0 when the filter kept nothing and the update was skipped
SNR_KEPT_FRACTION = "snr/kept_fraction"  # share of groups the filter kept
SNR_GROUPS_KEPT = "snr/groups_kept"  # groups the filter kept
SNR_GROUPS_TOTAL = "snr/groups_total"  # groups the filter ranked
# mean in-group reward std with filter.ddof, before the filter (snr.stopping.SPREAD_METRIC)
SNR_REWARD_STD_MEAN = "snr/reward_std_mean"
SNR_KEPT_REWARD_STD_MEAN = "snr/kept_reward_std_mean"  # the same over the kept groups
SNR_REWARD_STD_MAX = "snr/reward_std_max"  # the largest in-group reward std, before the filter (0: every group flat)
# groups whose filter.signal values (the rewards, by default) are all equal: no spread, no task signal
SNR_ZERO_SPREAD_GROUPS = "snr/zero_spread_groups"

# -- the MI probe (keys of mi_probe's estimators and EMA, under PROBE) ------------------------
PROBE_MI_ESTIMATE = "probe/mi_estimate"  # MI of reasoning and prompt, mean token log-probs (nats)
PROBE_MI_ESTIMATE_SEQ = "probe/mi_estimate_seq"  # the same with sequence-summed log-probs (nats)
PROBE_MI_UPPER_BOUND = "probe/mi_upper_bound"  # log N, N the scored prompts (nats)
PROBE_MI_ZSCORE = "probe/mi_zscore"  # MI over the std of the marginal (unitless)
PROBE_MI_ZSCORE_EMA = "probe/mi_zscore_ema"  # the same with an EMA of that std (RAGEN-2's MI-ZScore-EMA)
PROBE_RETRIEVAL_ACCURACY_AT_1 = "probe/retrieval_accuracy@1"  # share of rows whose own prompt scores best
PROBE_RETRIEVAL_CHANCE_LEVEL_AT_1 = "probe/retrieval_chance_level@1"  # that share by chance
PROBE_CONDITIONAL_ENTROPY_EST = "probe/conditional_entropy_est"  # H(Z|X) estimate (nats/token)
PROBE_REASONING_ENTROPY_EST = "probe/reasoning_entropy_est"  # H(Z) estimate (nats/token)
PROBE_NUM_ROWS = "probe/num_rows"  # reasoning segments scored
PROBE_SKIPPED_TOO_FEW_GROUPS = "probe/skipped_too_few_groups"  # 1.0 when fewer than 2 prompts had a segment
PROBE_DTYPE = "probe/dtype"  # what the probe scored in: "bfloat16", "float32" (a string; probe.dtype)

# -- OpenRLHF agent's per-episode extra logs (engines/openrlhf/agent -> selection, completions)
ENV_NUM_TURNS = "env/num_turns"  # turns the episode took
ENV_FORMAT_OK_FRACTION = "env/format_ok_fraction"  # share of the episode's turns that parsed
ENV_VALID_ACTION_FRACTION = "env/valid_action_fraction"  # share of the episode's turns the env called valid
ENV_CONTEXT_TRUNCATED = "env/context_truncated"  # 1.0 when the episode's context was cut
