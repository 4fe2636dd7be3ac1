"""The StarPO rollout: P groups x G samples, K turns, one batched generation per turn.

    batch = rollout(model, tokenizer, lambda: envs.make("sokoban"), seeds=[11, 12], config=cfg,
                    generator=torch.Generator().manual_seed(0))

Group g's G members reset with the same seed (the same instance) and `rollout_index` = member
(their own dynamics coins). Each turn every live episode's prompt goes into one `generate` call
and each reply goes back to its episode; episodes that are over leave the batch.

The turn protocol (prompts, prefill, the context rule, env steps, rewards, records, training
rows, context "full" or "window") is `ragen2.rollout.episode.Episode`, which the OpenRLHF agent
drives too; this module only batches its prompts and samples its replies.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ragen2 import metric_names as names
from ragen2.progress import RolloutProgress
from ragen2.rollout.batch import RolloutBatch, TrajectoryRecord
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.config import RolloutConfig
from ragen2.rollout.episode import Episode, TurnRules
from ragen2.rollout.session import GenerationSession

def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (Llama-3 has several)."""
    ids = []
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    candidates += list(configured) if isinstance(configured, (list, tuple)) else [configured]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return ids


def pad_token_id(tokenizer) -> int:
    for token in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if token is not None:
            return int(token)
    return 0


def rollout(model, tokenizer, env_factory: Callable[[], object], seeds: Sequence[int], config: RolloutConfig,
            generator: torch.Generator | None = None, progress=None) -> RolloutBatch:
    """Roll out len(seeds) groups of config.group_size episodes; see the module doc.

    One GenerationSession serves every turn: each episode keeps its KV cache, so turn k feeds
    only the tokens added since turn k-1 (the reply's last token, the
    env's reward and next state). `progress(ragen2.progress.RolloutProgress)` is called as
    tokens are sampled (ragen2.progress.LiveLine draws it).
    """
    if not seeds:
        raise ValueError("rollout needs at least one seed (one per group)")
    chat = ChatFormat(tokenizer)
    rules = TurnRules(max_turns=config.max_turns, max_new_tokens=config.max_new_tokens,
                      max_context_tokens=config.max_context_tokens, max_response_words=config.max_response_words,
                      prefill=config.prefill_tag,
                      window_turns=config.window_turns if config.context == "window" else None)
    episodes = []
    for g, seed in enumerate(seeds):
        for member in range(config.group_size):
            episode = Episode(env_factory(), chat, rules, seed=seed, rollout_index=member, group=g, index=len(episodes))
            episode.reset()
            episodes.append(episode)
    eos_ids, pad_id = eos_token_ids(model, tokenizer), pad_token_id(tokenizer)
    sampling = dict(temperature=config.temperature, top_p=config.top_p, stop_strings=config.stop_strings,
                    eos_token_ids=eos_ids, pad_token_id=pad_id, tokenizer=tokenizer, generator=generator)
    session = GenerationSession(model, **sampling)
    turn, sampled_before = 0, 0

    while True:
        live, prompts = [], []
        for episode in episodes:
            if episode.done:
                continue
            prompt = episode.next_prompt()  # None: the context rule ended it
            if prompt is None:
                continue
            live.append(episode)
            prompts.append(prompt)
        session.release([e.index for e in episodes if e.done])
        if not live:
            break
        turn += 1
        done = sum(e.done for e in episodes)

        def on_step(rows: int, tokens: int, turn=turn, base=sampled_before, starting=len(live), done=done) -> None:
            progress(RolloutProgress(turn, config.max_turns, rows, starting, tokens, base + tokens,
                                     config.max_new_tokens, done, len(episodes)))

        results = session.generate([e.index for e in live], prompts, max_new_tokens=config.max_new_tokens,
                                   on_step=on_step if progress is not None else None)
        turn_tokens = sum(len(r.token_ids) for r in results)
        sampled_before += turn_tokens
        for episode, result in zip(live, results):
            episode.take_reply(result.token_ids, result.logprobs, result.finish_reason)
        if progress is not None:
            progress(RolloutProgress(turn, config.max_turns, 0, len(live), turn_tokens, sampled_before,
                                     config.max_new_tokens, sum(e.done for e in episodes), len(episodes)))

    rows = [row for episode in episodes for row in episode.rows()]
    for episode in episodes:
        episode.env.close()
    return RolloutBatch.from_records(rows, [e.record for e in episodes], pad_token_id=pad_id,
                                     group_size=config.group_size)


def group_pass_rate(trajectories: Sequence[TrajectoryRecord]) -> float:
    """The share of groups in which at least one member succeeded (pass@G)."""
    passed: dict[int, bool] = {}
    for t in trajectories:
        passed[t.group] = passed.get(t.group, False) or t.success
    return sum(passed.values()) / len(passed) if passed else 0.0


def spread_share(trajectories: Sequence[TrajectoryRecord]) -> float:
    """The share of groups whose episode rewards are not all equal: the groups a group advantage or
    a spread filter can learn from."""
    rewards: dict[int, list[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.group, []).append(t.reward)
    spread = [max(r) - min(r) > 1e-9 for r in rewards.values()]
    return sum(spread) / len(spread) if spread else 0.0


def valid_action_share(trajectories: Sequence[TrajectoryRecord]) -> float:
    """The share of turns with no format penalty: some action ran and none was invalid."""
    turns = [bool(a["executed"]) and a["num_invalid"] == 0 for t in trajectories for a in t.actions]
    return sum(turns) / len(turns) if turns else 0.0


# Validation groups rolled out at once. A multi-turn rollout's row cache holds every row's whole
# history: 32 FrozenLake think-mode groups of 4 at once took an SFT process to 9.4 GB and the kernel
# killed it; 8 groups hold a quarter of that. Validations of up to 8 groups are one rollout, as before.
VALIDATION_CHUNK_GROUPS = 8


def rollout_in_chunks(model, tokenizer, env_factory: Callable[[], object], seeds: Sequence[int],
                      config: RolloutConfig, generator: torch.Generator | None = None, progress=None,
                      chunk_groups: int = VALIDATION_CHUNK_GROUPS) -> RolloutBatch:
    """One batch of all `seeds`' groups, rolled out `chunk_groups` groups at a time (one generator,
    drawn chunk after chunk), so the row caches of a large batch never live at once."""
    batches = [rollout(model, tokenizer, env_factory, seeds[i:i + chunk_groups], config, generator, progress=progress)
               for i in range(0, len(seeds), chunk_groups)]
    return batches[0] if len(batches) == 1 else RolloutBatch.concat(batches)


def evaluate(model, tokenizer, env_factory: Callable[[], object], seeds: Sequence[int], config: RolloutConfig,
             generator: torch.Generator | None = None, progress=None,
             chunk_groups: int = VALIDATION_CHUNK_GROUPS) -> dict[str, float]:
    """Validation: success rate over all episodes and pass@G (a group passes if any member succeeds),
    rolled out `chunk_groups` groups at a time (rollout_in_chunks)."""
    batch = rollout_in_chunks(model, tokenizer, env_factory, seeds, config, generator, progress, chunk_groups)
    return validation_metrics(batch, config.group_size)


def validation_metrics(batch: RolloutBatch, group_size: int) -> dict[str, float]:
    """What validation reports of a rollout: success, pass@G, spread and valid-action shares, reward, format,
    share of degenerate replies."""
    metrics = batch.metrics(prefix=names.VAL)
    return {
        names.VAL_SPREAD_SHARE: spread_share(batch.trajectories),
        names.VAL_VALID_ACTION_SHARE: valid_action_share(batch.trajectories),
        names.VAL_SUCCESS_RATE: metrics[names.VAL_SUCCESS_RATE],
        names.val_pass_at(group_size): group_pass_rate(batch.trajectories),
        names.VAL_REWARD_MEAN: metrics[names.VAL_REWARD_MEAN],
        names.VAL_FORMAT_OK_FRACTION: metrics[names.VAL_FORMAT_OK_FRACTION],
        names.VAL_NUM_GROUPS: metrics[names.VAL_NUM_GROUPS],
        names.VAL_DEGENERATE_FRACTION: metrics[names.VAL_DEGENERATE_FRACTION],  # the audit draws it beside training's
    }
