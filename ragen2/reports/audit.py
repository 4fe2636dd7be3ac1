"""`ragen2 audit`: template-collapse diagnostics for a finished run, or for any model.

    ragen2 audit RUN_DIR [--out DIR]              HTML report + JSON summary (see audit_report.py)
    ragen2 audit --model PATH_OR_ID --env NAME    roll out fresh groups, probe them, print a verdict

`--model` takes "bundled", a hub id, a saved Hugging Face model directory, or a ragen2
checkpoint: a run directory (its latest checkpoint), `checkpoints/step_N`, or
`step_N/policy`. A checkpoint is the base model named in the run's config.yaml (with its
LoRA adapters, if the run used them) plus the saved weights.

The verdict reads two things: does the reasoning identify its own prompt better than
chance (retrieval accuracy@1 against 1/N, as a z-score over the rows), and is the
reasoning still varied (policy token entropy). Varied reasoning that does not identify
its input is template collapse, but only with enough rows from a model that mostly writes
the format; otherwise the verdict is "inconclusive" and says what to change. It also counts
the degenerate replies (mi_probe.degeneration) and leads with them where they are many. The
exact rules are in `audit_verdict.py`. `--compare-base` audits a checkpoint's base model on the
same instances and prints the differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mi_probe.degeneration import judge_reply
from ragen2 import metric_names as names
from ragen2 import models as model_lib
from ragen2.reports.audit_verdict import (AuditSettings, compare_with_base, model_verdict, retrieval_zscore,  # noqa: F401
                                  run_verdict)
from ragen2.config import ModelSection, ProbeSection
from ragen2.instruments.probe import Probe
from ragen2 import scoring  # the update's scoring pass, the one implementation
from ragen2.rollout import RolloutConfig, rollout
from ragen2.run_dir import CONFIG_FILE, POLICY_DIR, latest_checkpoint, read_config
from ragen2.seeding import audit_seeds


@dataclass
class ModelSpec:
    source: str  # what `from_pretrained` loads: bundled cache dir, model dir or hub id
    weights: Path | None = None  # a ragen2 `save_model` folder loaded on top
    run_config: dict | None = None  # the run's config.yaml, when the model is a checkpoint


# --- loading a model -------------------------------------------------------------------------


def _run_config_above(path: Path) -> dict | None:
    for folder in [path, *path.parents][:5]:
        config = read_config(folder)
        if config is not None:
            return config
    return None


def resolve_model(spec: str) -> ModelSpec:
    """Where the weights of `spec` come from (see the module doc for what it accepts)."""
    path = Path(spec).expanduser()
    weights = None
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / model_lib.WEIGHTS_FILE).is_file():
            weights = path  # step_N/policy
        elif (path / POLICY_DIR / model_lib.WEIGHTS_FILE).is_file():
            weights = path / POLICY_DIR  # step_N
        elif (path / CONFIG_FILE).is_file():
            latest = latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(f"{path} is a run directory without a complete checkpoint")
            weights = latest / POLICY_DIR
        else:
            raise FileNotFoundError(f"{path}: neither a model directory (config.json), a ragen2 checkpoint "
                                    f"({POLICY_DIR}/{model_lib.WEIGHTS_FILE}) nor a run directory ({CONFIG_FILE})")
    if weights is None:
        return ModelSpec(model_lib.resolve_model_source(spec))
    run_config = _run_config_above(weights)
    if run_config is None:
        raise FileNotFoundError(f"{weights}: found no {CONFIG_FILE} above it naming the base model")
    base = run_config.get("model", {}).get("name", model_lib.DEFAULT_MODEL)
    return ModelSpec(model_lib.resolve_model_source(base), weights, run_config)


def load_model(spec: ModelSpec, device: str = "cpu"):
    """(policy, tokenizer) for a resolved spec; a checkpoint's weights are loaded on top."""
    # a checkpoint as its run built it (the config's model section, its defaults where a key is
    # missing); a plain model in fp32
    saved = (spec.run_config or {}).get("model", {}) if spec.weights is not None else {"dtype": "float32"}
    model_cfg = ModelSection(**{**{key: value for key, value in saved.items() if key in ModelSection.model_fields},
                                "name": spec.source})
    policy, tokenizer = model_lib.build_policy(model_cfg, device, spec.weights)
    return policy.eval(), tokenizer


# --- measuring ---------------------------------------------------------------------------------


def policy_entropy(policy, batch, temperature: float, micro_batch_size: int = 4) -> float:
    """Mean entropy (nats) of the policy's next-token distribution over every sampled token."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(batch), micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            mask = batch.response_mask[rows]
            tokens = scoring.TokenRows(batch.input_ids[rows], batch.attention_mask[rows], mask)
            _, entropy = scoring.policy_log_probs(policy, tokens, temperature, with_entropy=True)
            total += float((entropy * mask).sum())
            count += int(mask.sum())
    return total / count if count else float("nan")


def audit_model(policy, tokenizer, env_factory, settings: AuditSettings) -> dict:
    """Roll out fresh groups, cross-score their reasoning (or whole replies), and return the numbers."""
    seeds = audit_seeds(settings.seed, settings.groups)
    config = RolloutConfig(group_size=settings.group_size, max_turns=settings.max_turns,
                           max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    batch = rollout(policy, tokenizer, env_factory, seeds, config, torch.Generator().manual_seed(settings.seed))
    probe_env = env_factory()
    think = bool(getattr(getattr(probe_env, "config", None), "require_think", True))
    probe_env.close()
    # auto: as a run resolves it, the env decides (an answer-only env has no reasoning)
    segment = settings.segment if settings.segment != "auto" else "reasoning" if think else "reply"
    probe = Probe(ProbeSection(every=1, num_samples=max(2, settings.num_samples), mode=settings.mode,
                               segment=segment), tokenizer)
    measured = probe.measure(policy, batch, settings.seed)
    numbers = {key.removeprefix(names.PROBE): value for key, value in measured.items()}
    numbers.update(segment=segment, think_mode=think, max_turns=settings.max_turns)  # what the verdict's advice fits
    rollout_metrics = batch.metrics()
    numbers.update(policy_entropy=policy_entropy(policy, batch, settings.temperature),
                   success_rate=rollout_metrics[names.ROLLOUT_SUCCESS_RATE],
                   reward_mean=rollout_metrics[names.ROLLOUT_REWARD_MEAN],
                   think_span_fraction=rollout_metrics[names.ROLLOUT_THINK_SPAN_FRACTION],
                   format_ok_fraction=rollout_metrics[names.ROLLOUT_FORMAT_OK_FRACTION],
                   num_trajectories=rollout_metrics[names.ROLLOUT_NUM_TRAJECTORIES])
    numbers.update(degeneration(batch))
    return numbers


def degeneration(batch, example_chars: int = 40) -> dict:
    """The rollout's degenerate replies (every turn's, judged as the training rollout's
    rollout/degenerate_fraction judges them): their share, the counts behind it, and the start of
    the first one, so that the verdict shows what the repetition looks like."""
    replies = [pair for t in batch.trajectories for pair in zip(t.response_texts, t.finish_reasons)]
    degenerate = [text for text, reason in replies if judge_reply(text, reason).degenerate]
    return {"degenerate_fraction": len(degenerate) / len(replies) if replies else 0.0,
            "num_replies": len(replies), "degenerate_replies": len(degenerate),
            "degenerate_example": degenerate[0][:example_chars] if degenerate else None}


def verdict(numbers: dict) -> tuple[str, str]:
    """(label, explanation) from `audit_model`'s numbers; the rule is `audit_verdict.model_verdict`."""
    return model_verdict(numbers)
