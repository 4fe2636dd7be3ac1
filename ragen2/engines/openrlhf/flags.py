"""Translate a ragen2 config into an OpenRLHF 0.11.2 launch: flags, datasets and settings.

    plan = plan_launch(cfg, run_dir, Cluster(nodes=1, gpus_per_node=8))
    plan.command   # ["python", "-m", "ragen2.engines.openrlhf.launch", "--ragen2.settings", …, "--actor…"]
    plan.files     # {path: text}: train/val prompt datasets (JSONL) and the settings JSON

Pure: nothing here imports OpenRLHF, so `--dry-run` works on any machine. Flag names are
0.11.2's dotted names (`--actor.*`, `--algo.*`, `--train.*`, `--rollout.*`; 0.10.2 renamed
them all). Every config value OpenRLHF cannot express raises UnsupportedConfig naming the key;
all such problems of one config are reported together.

One prompt row per env instance: OpenRLHF draws `--rollout.batch_size` rows per step and samples
`--rollout.n_samples_per_prompt` episodes of each, so a row is one of our groups. The row's label
carries the episode settings (env, its config, the seed, the per-turn token cap, ...), read by
`agent.AgentExecutor`; the prompt text is only an id, the executor renders the real prompt
through the chat template. Seeds are the local engine's (`seeding.step_seeds`), so both engines
meet the same instances in the same steps.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import envs
from envs.parsing import prefill_tag as prefill_tag_for
from ragen2.config import Config, ConfigError
from ragen2.rollout.config import RolloutConfig
from ragen2.engines.openrlhf import OPENRLHF_VERSION
from ragen2.engines.openrlhf.memory import ModelShape, estimate, read_model_config
from ragen2.run_dir import CHECKPOINTS_DIR, CONFIG_FILE, OPENRLHF_DIR, OPENRLHF_MODEL_DIR, TENSORBOARD_DIR
from ragen2.seeding import step_seeds, validation_seeds

LAUNCH_MODULE = "ragen2.engines.openrlhf.launch"
SETTINGS_FLAG = "--ragen2.settings"
WANDB_KEY_PLACEHOLDER = "${WANDB_API_KEY}"  # filled from the environment at launch, never written out
OPENRLHF_GROUP_STD_EPS = 1e-9  # experience_maker's group_norm: (r - mean) / (std + 1e-9)
BUNDLED_NAMES = ("bundled", "smollm2", "smollm2-135m-instruct")  # ragen2.models.BUNDLED_NAMES
ESTIMATORS = {"gae": "gae", "grpo": "group_norm", "dr_grpo": "dr_grpo"}
OPENRLHF_LOSS_AGG = ("token-mean", "seq-mean-token-mean")  # --actor.loss_agg_mode choices
REWARD_CLIP = 1e9  # "no clipping" for --reward.clip_range
# auto: OpenRLHF runs on GPUs, bf16. No fp16: OpenRLHF 0.11.2 starts vLLM in bfloat16 whatever
# --ds.param_dtype says (create_vllm_engines: "dtype": "bfloat16"), and its weight sync asserts equal dtypes.
DTYPES = {"auto": "bf16", "bfloat16": "bf16"}


class UnsupportedConfig(ConfigError):
    """Config values the OpenRLHF engine cannot run; the message names each key."""


@dataclass(frozen=True)
class Cluster:
    """Where the run goes: every model (actor, critic, reference, vLLM) colocated on all GPUs."""

    nodes: int = 1
    gpus_per_node: int = 8
    vllm_tensor_parallel: int = 1
    gpu_memory_gib: float = 80.0  # each GPU's memory, for --dry-run's estimate (memory.py)

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "vllm_tensor_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UnsupportedConfig(f"cluster: {name} must be an int >= 1, got {value!r}")
        if isinstance(self.gpu_memory_gib, bool) or not isinstance(self.gpu_memory_gib, (int, float)) \
                or not self.gpu_memory_gib > 0:
            raise UnsupportedConfig(f"cluster: gpu_memory_gib must be a number > 0, got {self.gpu_memory_gib!r}")
        if self.gpus // self.vllm_tensor_parallel * self.vllm_tensor_parallel != self.gpus:
            raise UnsupportedConfig(f"cluster: {self.gpus} GPUs cannot be split into vLLM engines of "
                                    f"tensor-parallel size {self.vllm_tensor_parallel}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def data_parallel(self) -> int:
        """DeepSpeed data-parallel ranks of the actor (no ring attention or DeepSpeed TP here)."""
        return self.gpus

    @property
    def vllm_engines(self) -> int:
        return self.gpus // self.vllm_tensor_parallel


@dataclass
class LaunchPlan:
    command: list[str]  # argv, launcher first; the wandb key as a placeholder
    files: dict[Path, str]  # what to write before launching
    settings: dict  # the trainer subclass's settings (also in files, as JSON)
    notes: list[str] = field(default_factory=list)  # approximations worth knowing

    @property
    def openrlhf_flags(self) -> list[str]:
        return self.command[self.command.index(SETTINGS_FLAG) + 2:]


# ----------------------------------------------------------------------------- checks


def _set_explicitly(section, key: str) -> bool:
    return key in section.model_fields_set


def unsupported(cfg: Config) -> list[str]:
    """One line per config value OpenRLHF 0.11.2 cannot express, each naming its key."""
    problems = []
    m, r, a, f, p = cfg.model, cfg.rollout, cfg.algo, cfg.filter, cfg.probe
    if m.name.lower() in BUNDLED_NAMES:
        problems.append(f"model.name={m.name}: the bundled model is a GGUF file dequantised on first use; vLLM and "
                        "DeepSpeed need a Hugging Face model on every node: pass --model with a hub id (e.g. "
                        "HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-3B-Instruct) or a directory present on "
                        "every node")
    if m.dtype == "float16":
        problems.append("model.dtype=float16: OpenRLHF 0.11.2 always starts vLLM in bfloat16 (no flag sets its "
                        "dtype) and its weight sync asserts that the trained weights have vLLM's dtype, so fp16 "
                        "would die at the first sync; set model.dtype=bfloat16 (GPUs of compute capability 8.0+)")
    elif m.dtype not in DTYPES:
        problems.append(f"model.dtype={m.dtype}: OpenRLHF trains in bf16 (--ds.param_dtype); "
                        "set model.dtype=bfloat16")
    if m.lora_rank > 0:
        # ppo_actor.broadcast_to_vllm sends model.named_parameters() of the PEFT model as they are
        problems.append(f"model.lora_rank={m.lora_rank}: OpenRLHF 0.11.2 syncs a LoRA actor to vLLM under PEFT's "
                        "parameter names (base_model.model....base_layer.weight, ...lora_A.default.weight), unmerged, "
                        "which vLLM cannot load, so the run would die at the first weight sync; set "
                        "model.lora_rank=0 (full fine-tuning) or train LoRA with the local engine")
    if m.device not in ("auto", "cuda"):
        problems.append(f"model.device={m.device}: Ray places the models on GPUs; leave model.device=auto")
    for key in ("stop_strings", "prefill_tag"):  # the agent's are fixed at the local rollout's defaults
        if getattr(r, key) != getattr(RolloutConfig(), key):
            problems.append(f"rollout.{key}={json.dumps(getattr(r, key))}: the OpenRLHF agent ends a turn at </answer> "
                            f"and opens it with the format's tag; leave rollout.{key} at its default")
    if r.context != "full":
        problems.append("rollout.context=window: an OpenRLHF agent returns one token sequence per episode "
                        "(observation_tokens + action_ranges); window mode trains each turn as its own row")
    if a.advantage not in ESTIMATORS:
        problems.append(f"algo.advantage={a.advantage}: OpenRLHF's estimators are gae, group_norm, dr_grpo, "
                        f"reinforce, rloo, reinforce_baseline, flash_reinforce; ragen2 maps {sorted(ESTIMATORS)}")
    if a.advantage == "gae" and r.max_turns > 1:
        for key, value in (("gamma", a.gamma), ("lam", a.lam)):
            if value != 1.0:
                problems.append(f"algo.{key}={value}: OpenRLHF's GAE runs over every position of the sequence, "
                                "so with several turns it discounts across the env's tokens too; only "
                                f"algo.{key}=1.0 gives the local engine's multi-turn GAE")
    if a.loss_agg not in OPENRLHF_LOSS_AGG:
        problems.append(f"algo.loss_agg={a.loss_agg}: --actor.loss_agg_mode offers only {list(OPENRLHF_LOSS_AGG)}")
    if cfg.optim.loss_scope != "mini_batch":
        # OpenRLHF 0.11.2 (utils/loss_utils.py iter_grad_accum_global_norm) divides every term by
        # the token / sample count of the whole optimizer step, over its micro-batches and ranks:
        # our mini_batch scope. No flag gives veRL's mean of per-micro-batch means.
        problems.append(f"optim.loss_scope={cfg.optim.loss_scope}: OpenRLHF 0.11.2 aggregates each loss over the "
                        "whole optimizer step (all micro-batches and GPUs), which is optim.loss_scope=mini_batch; "
                        "it has no per-micro-batch mean (veRL's). Set optim.loss_scope=mini_batch (with "
                        "optim.micro_batch_size=1, algo.loss_agg=seq-mean-token-mean weighs sequences equally as "
                        "veRL's micro_batch token-mean does, for the policy term only)")
    if a.uses_critic and a.value_clip is None:
        problems.append("algo.value_clip=null: OpenRLHF always clips the value (--critic.value_clip); set a number")
    if (a.advantage == "grpo" and _set_explicitly(a, "grpo_std_eps")
            and not math.isclose(a.grpo_std_eps, OPENRLHF_GROUP_STD_EPS)):
        problems.append(f"algo.grpo_std_eps={a.grpo_std_eps}: OpenRLHF's group_norm divides by std + "
                        f"{OPENRLHF_GROUP_STD_EPS:g}, fixed")
    if a.filter_loss_scaling != "none":
        problems.append(f"algo.filter_loss_scaling={a.filter_loss_scaling}: the OpenRLHF actor computes its own "
                        "loss; only 'none' is supported")
    if f.strategy != "none" and f.metric == "given":
        problems.append("filter.metric=given: the OpenRLHF engine ranks groups by their reward spread only")
    if f.max_rounds > 1:  # OpenRLHF's trainer samples one batch per step; our filter only selects from it
        problems.append(f"filter.max_rounds={f.max_rounds}: dynamic sampling (extra generation rounds) runs in "
                        "the local engine only; the OpenRLHF engine filters the batch it sampled; set "
                        "filter.max_rounds=1")
    if p.dtype == "float32":
        problems.append("probe.dtype=float32: the OpenRLHF engine scores the probe with the actor's own forward, "
                        "in DeepSpeed's bf16 (the policy's compute dtype, as RAGEN-2 scores); it keeps no fp32 "
                        "copy of the actor to score with. Set probe.dtype=policy (the default)")
    if p.grad_every > 0:
        problems.append(f"probe.grad_every={p.grad_every}: the gradient decomposition needs the actor's backward "
                        "pass, which runs inside OpenRLHF's DeepSpeed workers; set probe.grad_every=0")
    for key in ("stop_on_collapse", "stop_on_early_warning"):
        if getattr(p, key):
            problems.append(f"probe.{key}=true: the collapse detector is not wired into the OpenRLHF engine "
                            "(the MI probe's metrics are logged); set it to false")
    return problems


def batch_unit(cfg: Config, cluster: Cluster) -> int:
    """The sample count every trained step must be a multiple of.

    Experiences are concatenated `--rollout.micro_batch_size` at a time and dealt out to the
    data-parallel ranks in equal chunks; each rank then steps its optimizer every
    `train_batch / (micro * dp)` micro-batches (DeepSpeed's gradient accumulation). A count that
    is not a multiple of lcm(micro * dp, train_batch) leaves a rank with fewer micro-batches (a
    hung collective) or with accumulated gradients that never reach an optimizer step.
    """
    o = cfg.optim
    return math.lcm(o.micro_batch_size * cluster.data_parallel, o.mini_batch_size)


def batch_problems(cfg: Config, cluster: Cluster) -> list[str]:
    o, r = cfg.optim, cfg.rollout
    per_step = o.micro_batch_size * cluster.data_parallel
    if o.mini_batch_size % per_step:
        return [f"optim.mini_batch_size={o.mini_batch_size}: DeepSpeed's global batch must be a multiple of "
                f"optim.micro_batch_size ({o.micro_batch_size}) x data-parallel GPUs ({cluster.data_parallel}) "
                f"= {per_step}"]
    unit = batch_unit(cfg, cluster)
    if (r.num_groups * r.group_size) % unit:
        return [f"rollout.num_groups={r.num_groups} x rollout.group_size={r.group_size} = "
                f"{r.num_groups * r.group_size} samples per step is not a multiple of {unit} (the lcm of "
                f"optim.mini_batch_size and optim.micro_batch_size x {cluster.data_parallel} GPUs)"]
    f = cfg.filter
    if f.strategy in ("top_k", "top_k_abs"):  # a fixed count: it must fill at least one batch unit
        kept = max(1, int(f.value * r.num_groups + 1e-9)) if f.strategy == "top_k" else int(f.value)
        if min(kept, r.num_groups) * r.group_size < unit:
            return [f"filter.value={f.value}: {f.strategy} keeps {kept} groups = {kept * r.group_size} samples, "
                    f"fewer than one batch unit ({unit}), so every step would be skipped; lower "
                    "optim.mini_batch_size / optim.micro_batch_size or keep more groups"]
    return []


# ----------------------------------------------------------------------------- resolved at launch


def flash_attn_usable() -> bool:
    """flash-attn is installed (a distribution, so a stand-in module does not count) and imports here."""
    try:
        importlib.metadata.version("flash_attn")
        importlib.import_module("flash_attn")
    except Exception:  # noqa: BLE001 - not installed, or a wheel built for another torch / CUDA
        return False
    return True


def resolve(cfg: Config) -> tuple[Config, list[str]]:
    """`cfg` with `auto` values of the openrlhf section made concrete (config.yaml records them), and
    a note for each. Decided on the launching node, which should be one of the GPU nodes."""
    from ragen2.instruments.probe import resolve_run_segment

    if cfg.openrlhf.attn_implementation != "auto" and cfg.probe.segment != "auto":
        return cfg, []
    cfg = cfg.model_copy(deep=True)
    notes = [note] if (note := resolve_run_segment(cfg)) else []
    if cfg.openrlhf.attn_implementation != "auto":
        return cfg, notes
    attn, why = (("flash_attention_2", "flash-attn is installed") if flash_attn_usable() else
                 ("sdpa", "flash-attn is not installed here (or does not import)"))
    cfg.openrlhf.attn_implementation = attn
    return cfg, [*notes, f"openrlhf.attn_implementation=auto resolved to {attn}: {why}"]


# ----------------------------------------------------------------------------- files


def prefill_tag(cfg: Config) -> str:
    """The tag that opens every assistant turn in the prompt (the agent's episode writes it)."""
    return prefill_tag_for(envs.spec(cfg.env.name).make_config(**cfg.env.overrides).require_think)


def episode_label(cfg: Config, env_name: str, overrides: dict, seed: int) -> str:
    """The label of one prompt row: everything the agent needs to play one episode."""
    r = cfg.rollout
    # group_size: the agent numbers a label's samples 0..G-1 (train and eval both sample G per row)
    return json.dumps({"env": env_name, "env_config": overrides, "seed": int(seed), "max_turns": r.max_turns,
                       "max_new_tokens": r.max_new_tokens, "max_response_words": r.max_response_words,
                       "group_size": r.group_size}, sort_keys=True)


def dataset_rows(cfg: Config, split: str) -> list[dict]:
    """Prompt rows: `train` = total_steps x num_groups instances in step order, `val` = val_groups."""
    if split == "train":
        name, overrides = cfg.env.name, cfg.env.overrides
        seeds = [s for step in range(cfg.trainer.total_steps) for s in step_seeds(cfg, step)]
    elif split == "val":
        name = cfg.env.val_name or cfg.env.name
        overrides = {} if cfg.env.val_name else cfg.env.overrides  # as trainer.env_factory builds it
        seeds = validation_seeds(cfg)
    else:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return [{"prompt": f"{name} seed={seed}", "label": episode_label(cfg, name, overrides, seed), "datasource": name}
            for seed in seeds]


def trainer_settings(cfg: Config, cluster: Cluster, run_dir: Path | None = None) -> dict:
    """What the trainer subclass needs (filter, stop policy, probe, batch unit, where to write the
    run's metrics.jsonl and summary.json), as plain JSON."""
    return {
        "version": 1,
        "group_size": cfg.rollout.group_size,
        "batch_unit": batch_unit(cfg, cluster),
        "filter": cfg.filter.to_dict(),
        "stop": {k: getattr(cfg.stop, k) for k in ("max_consecutive_skips", "spread_baseline", "spread_patience",
                                                    "spread_ratio")},
        "probe": json.loads(cfg.probe.model_dump_json()),
        "prefill": prefill_tag(cfg),
        "temperature": cfg.rollout.temperature,
        "total_steps": cfg.trainer.total_steps,  # the controller's eval / checkpoint schedule (rollout steps)
        "val_every": cfg.trainer.val_every,
        "save_every": cfg.trainer.save_every,
        "log_completions": cfg.trainer.log_completions,
        "run_dir": str(run_dir) if run_dir is not None else None,
    }


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


# ----------------------------------------------------------------------------- flags


def _num(value) -> str:
    """A number as argparse reads it back exactly (repr of a float round-trips)."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def agent_path() -> Path:
    """The agent file OpenRLHF loads by path in each vLLM worker (installed with ragen2): a shim
    that imports `agent.AgentExecutor` from its module (see agent_entry.py)."""
    return Path(__file__).resolve().parent / "agent_entry.py"


def openrlhf_flags(cfg: Config, cluster: Cluster, run_dir: Path) -> list[str]:
    m, r, a, o, t = cfg.model, cfg.rollout, cfg.algo, cfg.optim, cfg.trainer
    files = run_dir / OPENRLHF_DIR
    gpus = ["--{}.num_nodes", str(cluster.nodes), "--{}.num_gpus_per_node", str(cluster.gpus_per_node)]

    def placed(role: str) -> list[str]:
        return [item.format(role) for item in gpus]

    if cfg.openrlhf.attn_implementation == "auto":
        raise ValueError("openrlhf.attn_implementation=auto: resolve(cfg) first")
    flags = ["--actor.model_name_or_path", m.name, "--ds.param_dtype", DTYPES[m.dtype],
             "--ds.attn_implementation", cfg.openrlhf.attn_implementation, *placed("actor")]
    if a.kl_coef > 0:
        flags += placed("ref")
    if a.uses_critic:
        flags += ["--critic.model_name_or_path", m.name, *placed("critic")]
    flags += ["--vllm.num_engines", str(cluster.vllm_engines), "--vllm.tensor_parallel_size",
              str(cluster.vllm_tensor_parallel), "--vllm.gpu_memory_utilization",
              _num(cfg.openrlhf.vllm_gpu_memory_utilization),
              "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    flags += ["--train.agent_func_path", str(agent_path()),
              "--data.prompt_dataset", str(files / "train.jsonl"), "--data.input_key", "prompt",
              "--data.label_key", "label",
              # fit asks after every rollout step; the controller evaluates on the local engine's schedule
              "--eval.dataset", str(files / "val.jsonl"), "--eval.steps", "1",
              "--eval.temperature", _num(t.val_temperature), "--eval.n_samples_per_prompt", str(r.group_size)]
    flags += ["--rollout.batch_size", str(r.num_groups), "--rollout.n_samples_per_prompt", str(r.group_size),
              "--rollout.max_new_tokens", str(r.max_new_tokens), "--data.max_len", str(r.max_context_tokens),
              "--rollout.temperature", _num(r.temperature), "--rollout.top_p", _num(r.top_p),
              "--rollout.micro_batch_size", str(o.micro_batch_size)]
    flags += ["--train.batch_size", str(o.mini_batch_size), "--train.micro_batch_size", str(o.micro_batch_size),
              "--train.max_epochs", str(o.ppo_epochs), "--train.num_episodes", "1", "--train.seed", str(t.seed)]
    # OpenRLHF clips rewards to [-10, 10] by default; the local engine does not clip (Sokoban's can exceed 10)
    flags += ["--reward.clip_range", _num(-REWARD_CLIP), _num(REWARD_CLIP)]
    flags += ["--algo.advantage.estimator", ESTIMATORS[a.advantage]]
    if a.advantage == "gae":
        flags += ["--algo.advantage.gamma", _num(a.gamma), "--algo.advantage.lambd", _num(a.lam)]
    flags += ["--actor.eps_clip_low_high", _num(a.clip_low), _num(a.clip_high)]
    if a.dual_clip is not None:
        flags += ["--actor.dual_clip", _num(a.dual_clip)]
    flags += ["--actor.loss_agg_mode", a.loss_agg, "--actor.entropy_coef", _num(a.entropy_coef),
              "--algo.kl.init_coef", _num(a.kl_coef)]
    if a.kl_coef > 0:
        flags += (["--algo.kl.use_loss"] if a.kl_mode == "loss" else []) + ["--algo.kl.estimator", a.kl_estimator]
    roles = ["actor"] + (["critic"] if a.uses_critic else [])
    for role in roles:
        lr = o.actor_lr if role == "actor" else o.critic_lr
        flags += [f"--{role}.adam.lr", _num(lr), f"--{role}.adam.betas", _num(o.betas[0]), _num(o.betas[1]),
                  f"--{role}.adam.weight_decay", _num(o.weight_decay), f"--{role}.max_norm", _num(o.grad_clip),
                  f"--{role}.lr_scheduler", "constant"]  # the local engine's AdamW has no schedule
    if a.uses_critic:
        flags += ["--critic.value_clip", _num(a.value_clip)]
        if o.critic_warmup_steps:  # OpenRLHF runs the actor once global_step > freezing_steps
            flags += ["--critic.freezing_steps", str(o.critic_warmup_steps)]
    if m.gradient_checkpointing:
        flags += ["--actor.gradient_checkpointing_enable"]
    flags += ["--ckpt.output_dir", str(run_dir / OPENRLHF_MODEL_DIR), "--ckpt.path", str(run_dir / CHECKPOINTS_DIR),
              "--ckpt.save_steps", str(t.save_every or -1), "--ckpt.max_num", str(t.keep_last),
              "--ckpt.best_metric_key", "none",  # no DeepSpeed "best" checkpoint per improving eval
              "--logger.logging_steps", "1"]
    if t.tensorboard:
        flags += ["--logger.tensorboard_dir", str(run_dir / TENSORBOARD_DIR)]
    if t.wandb:
        flags += ["--logger.wandb.key", WANDB_KEY_PLACEHOLDER, "--logger.wandb.project", "ragen2",
                  "--logger.wandb.run_name", run_dir.name]
    return flags


def memory_estimate(cfg: Config, cluster: Cluster):
    """(memory.Estimate or None, notes): per-GPU memory from the model's config.json where it is on this machine."""
    shape = ModelShape.from_config(read_model_config(cfg.model.name) or {})
    if shape is None:
        return None, [f"memory per GPU: not estimated (no config.json of {cfg.model.name} on this machine, or one "
                      "without hidden_size / num_hidden_layers / num_attention_heads / vocab_size)"]
    found = estimate(cfg, shape, cluster.gpu_memory_gib, cluster.data_parallel, cluster.vllm_tensor_parallel)
    return found, [f"model: {shape.params / 1e9:.2f} B parameters (from its config.json)", *found.lines()]


def plan_launch(cfg: Config, run_dir: Path, cluster: Cluster | None = None, python: str | None = None) -> LaunchPlan:
    """The command and files of an OpenRLHF run of `cfg`; raises UnsupportedConfig first."""
    cluster = cluster or Cluster()
    problems = unsupported(cfg) + batch_problems(cfg, cluster)
    memory_notes, memory = [], None
    if not problems:
        memory, memory_notes = memory_estimate(cfg, cluster)
        problems += memory.problems() if memory is not None else []
    if problems:  # one line for one problem; otherwise one line each
        raise UnsupportedConfig(f"the OpenRLHF {OPENRLHF_VERSION} engine cannot run this config:"
                                + ("\n  " if len(problems) > 1 else " ") + "\n  ".join(problems))
    cfg, notes = resolve(cfg)
    notes += memory_notes
    run_dir = Path(run_dir).absolute()  # Ray workers run elsewhere: every path in the flags is absolute
    files = run_dir / OPENRLHF_DIR
    settings = trainer_settings(cfg, cluster, run_dir)
    written = {
        files / "train.jsonl": _jsonl(dataset_rows(cfg, "train")),
        files / "val.jsonl": _jsonl(dataset_rows(cfg, "val")),
        files / "settings.json": json.dumps(settings, indent=2, sort_keys=True) + "\n",
        run_dir / CONFIG_FILE: cfg.to_yaml(),
    }
    command = [python or sys.executable, "-m", LAUNCH_MODULE, SETTINGS_FLAG, str(files / "settings.json"),
               *openrlhf_flags(cfg, cluster, run_dir)]
    if cfg.optim.batch_adjust != "none":
        notes.append(f"optim.batch_adjust={cfg.optim.batch_adjust} is not applied: OpenRLHF keeps whole groups up to a "
                     "multiple of its batch unit and drops the rest (no rows copied)")
    if cfg.algo.uses_critic:
        notes.append(f"algo.value_coef={cfg.algo.value_coef} is not passed: OpenRLHF trains the critic with its own "
                     "optimizer on 0.5 x the clipped squared error (Adam is invariant to a constant loss scale, "
                     "gradient clipping aside)")
        notes.append("GAE advantages are whitened with the biased variance (OpenRLHF), the local engine uses n-1")
    if cfg.algo.uses_critic and cfg.rollout.max_turns > 1:
        notes.append("the episode's summed reward sits on its last token (OpenRLHF); the local engine puts each "
                     "turn's reward on that turn's end. With gamma = lam = 1 the two differ by rewards of earlier "
                     "turns, which the critic sees in the context")
    if cfg.algo.advantage == "grpo":
        notes.append(f"group_norm divides by std + {OPENRLHF_GROUP_STD_EPS:g} (local: + {cfg.algo.grpo_std_eps:g})")
    return LaunchPlan(command=command, files=written, settings=settings, notes=notes)
