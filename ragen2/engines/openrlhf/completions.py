"""completions.jsonl for the OpenRLHF engine: the local engine's records (ragen2.instruments.completions),
built from one step's samples (pure; no OpenRLHF import).

What a sample carries: its token ids and action mask (each turn's sampled tokens are one run of
the mask; decoded as the agent decodes them, with the prefilled tag in front, they are the text
the env parsed), its reward, its success (`scores`), its label (the episode spec: the seed) and
the agent's per-episode `env/...` logs. Not carried: the env's state text, each turn's reward and
the actions it executed: those are null here. Each turn's `format_ok` / `error` is the tag check
of envs.parsing, which does not depend on the env's state, so it is the one the env made.
"""

from __future__ import annotations

import json

from envs.parsing import THINK_OPEN, parse_response
from ragen2 import metric_names as names
from ragen2.instruments import completions
from ragen2.engines.openrlhf.probe_scoring import _spans
from ragen2.rollout.chat import ChatFormat, reply_text


def _scalar(value) -> float | None:
    if value is None:
        return None
    return float(value.reshape(-1)[0]) if hasattr(value, "reshape") else float(value)


def _seed(sample) -> int | None:
    labels = getattr(sample, "labels", None) or [None]
    try:
        return int(json.loads(labels[0])["seed"])
    except (TypeError, ValueError, KeyError):
        return None  # not a ragen2 episode label


def _turn_texts(sample, chat: ChatFormat, prefill: str, eos_id) -> list[str]:
    """The text of each turn (action_mask[t] marks token t+1 as sampled; left padding dropped)."""
    ids = sample.sequences.reshape(-1).tolist()
    attention = sample.attention_mask.reshape(-1).bool().tolist()
    sampled = [False] + [bool(v) for v in sample.action_mask.reshape(-1).tolist()]
    keep = [i for i, on in enumerate(attention) if on]
    ids, sampled = [ids[i] for i in keep], [sampled[i] for i in keep]
    texts = []
    for start, end in _spans(sampled):
        turn = ids[start:end]
        texts.append(prefill + reply_text(chat, turn, ended_with_eos=eos_id is not None and turn[-1] == eos_id))
    return texts


def sample_record(sample, group: int, member: int, rank: str, kept: bool | None, tokenizer, prefill: str) -> dict:
    info = getattr(sample, "info", None) or {}
    texts = _turn_texts(sample, ChatFormat(tokenizer), prefill, getattr(tokenizer, "eos_token_id", None))
    turns = []
    for text in texts:
        parsed = parse_response(text, vocabulary=None, require_think=prefill == THINK_OPEN)
        turns.append({"state": None, "response": text, "reward": None,
                      "parse": {"format_ok": parsed.format_ok, "error": None if parsed.format_ok else parsed.error}})
    success = _scalar(getattr(sample, "scores", None))
    return {"group": group, "member": member, "seed": _seed(sample), "rank": rank,
            "reward": _scalar(sample.rewards), "success": None if success is None else success > 0.5, "kept": kept,
            "num_turns": len(turns), "turns": turns, "final_state": None,
            "format_ok_fraction": _scalar(info.get(names.ENV_FORMAT_OK_FRACTION)),
            "valid_action_fraction": _scalar(info.get(names.ENV_VALID_ACTION_FRACTION))}


def pick_samples(samples: list, group_size: int, n: int, tokenizer, prefill: str, kept_groups=None) -> list[dict]:
    """The local engine's choice (ragen2.instruments.completions.choose) over a step's samples, before the filter:
    sample i is member i % G of group i // G, as OpenRLHF returns a prompt's samples together."""
    if n <= 0 or not samples:
        return []
    kept = None if kept_groups is None else {int(g) for g in kept_groups}
    rewards = [_scalar(s.rewards) for s in samples]
    return [sample_record(samples[i], i // group_size, i % group_size, rank,
                          None if kept is None else i // group_size in kept, tokenizer, prefill)
            for i, rank in completions.choose(rewards, n)]
