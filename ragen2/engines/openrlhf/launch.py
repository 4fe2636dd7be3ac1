"""`ragen2 train --engine openrlhf` and the process that runs OpenRLHF with ragen2's trainer.

Two halves:

- `run(cfg, run_dir, args)` (called by `ragen2 train`): translate the config (`flags`), write
  the datasets and settings into the run directory, print the exact command, and, unless
  `--dry-run`, run it.
- `main()` (the command itself: `python -m ragen2.engines.openrlhf.launch --ragen2.settings
  FILE <OpenRLHF 0.11.2 flags>`): put the settings into the Ray job's environment, install the
  trainer subclass (`trainer_patch.install`), and run `openrlhf.cli.train_ppo_ray` as
  `__main__` with the flags, so OpenRLHF parses and checks them itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

from ragen2.config import Config
from ragen2.engines.openrlhf import OPENRLHF_VERSION, SETTINGS_ENV
from ragen2.engines.openrlhf.flags import (SETTINGS_FLAG, WANDB_KEY_PLACEHOLDER, Cluster, LaunchPlan,
                                           UnsupportedConfig, plan_launch)

PREVIEW_ROWS = 3  # dataset rows shown by --dry-run (the files hold them all)
RAY_ENV_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
# Set by Ray in the driver of a `ray job submit` job: its runtime env (ray._private.runtime_env.constants)
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def add_arguments(parser) -> None:
    """The cluster options of `ragen2 train` (used with --engine openrlhf)."""
    group = parser.add_argument_group("OpenRLHF engine (--engine openrlhf)")
    group.add_argument("--nodes", type=int, default=1, help="Ray nodes (default 1)")
    group.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    group.add_argument("--vllm-tp", type=int, default=1, help="tensor-parallel size of each vLLM engine (default 1)")
    group.add_argument("--gpu-memory-gib", type=float, default=80.0,
                       help="memory of each GPU, for the per-GPU memory estimate and check (default 80)")


def cluster_from_args(args) -> Cluster:
    return Cluster(nodes=args.nodes, gpus_per_node=args.gpus_per_node, vllm_tensor_parallel=args.vllm_tp,
                   gpu_memory_gib=getattr(args, "gpu_memory_gib", 80.0))


def describe(plan: LaunchPlan, preview_rows: int = PREVIEW_ROWS) -> str:
    """The command and the generated files, as --dry-run prints them."""
    lines = [f"# OpenRLHF {OPENRLHF_VERSION} command:", shlex.join(plan.command), ""]
    for path, text in plan.files.items():
        rows = text.splitlines()
        shown = rows if path.suffix != ".jsonl" else rows[:preview_rows]
        lines.append(f"# {path} ({len(rows)} lines)")
        lines.extend(shown)
        if len(shown) < len(rows):
            lines.append(f"... {len(rows) - len(shown)} more rows")
        lines.append("")
    lines.extend(f"# note: {note}" for note in plan.notes)
    return "\n".join(lines)


def write_files(plan: LaunchPlan) -> None:
    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def resolved_command(plan: LaunchPlan, environ=None) -> list[str]:
    """The command with the wandb key taken from the environment (it is never written or printed)."""
    environ = os.environ if environ is None else environ  # as at call time (see runtime_env_vars)
    if WANDB_KEY_PLACEHOLDER not in plan.command:
        return list(plan.command)
    key = environ.get("WANDB_API_KEY")
    if not key:
        raise UnsupportedConfig("trainer.wandb=true: set WANDB_API_KEY (OpenRLHF's logger logs in with it)")
    return [key if item == WANDB_KEY_PLACEHOLDER else item for item in plan.command]


def run(cfg: Config, run_dir: Path, args) -> int:
    """`ragen2 train --engine openrlhf`: returns the exit status."""
    try:
        plan = plan_launch(cfg, run_dir, cluster_from_args(args))
    except UnsupportedConfig as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_files(plan)
    print(describe(plan))
    if getattr(args, "dry_run", False):
        print(f"dry run: files written under {Path(run_dir).absolute()}, nothing launched", file=sys.stderr)
        return 0
    if importlib.util.find_spec("openrlhf") is None:  # fail here, not inside Ray, when the extra is missing
        print(f'error: the OpenRLHF engine needs the extra: pip install "ragen2[openrlhf]" '
              f"(OpenRLHF {OPENRLHF_VERSION}, Ray, vLLM, DeepSpeed; see docs/distributed.md)", file=sys.stderr)
        return 2
    try:
        command = resolved_command(plan)
    except UnsupportedConfig as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return subprocess.run(command).returncode


# ----------------------------------------------------------------------------- the launched process


def split_argv(argv: list[str]) -> tuple[Path, list[str]]:
    """(settings file, OpenRLHF flags) from `--ragen2.settings FILE <flags>`."""
    if len(argv) < 2 or argv[0] != SETTINGS_FLAG:
        raise SystemExit(f"usage: python -m ragen2.engines.openrlhf.launch {SETTINGS_FLAG} FILE <OpenRLHF flags>")
    return Path(argv[1]), list(argv[2:])


def runtime_env_vars(environ=None) -> dict[str, str]:
    """The env vars the launched process's ray.init adds: the defaults (where the environment does not
    set them) and the settings, minus those a submitted job's runtime env sets already: Ray refuses to
    merge a variable set in both ("Failed to merge the Job's runtime env"), and the job's value is
    already this process's (Ray sets it in the driver and every worker)."""
    # read os.environ when called, not when defined: a library that rebinds os.environ (seen after
    # OpenRLHF's SFT modules were imported in the same process) would leave a default argument stale
    environ = os.environ if environ is None else environ
    job_env = json.loads(environ.get(RAY_JOB_CONFIG_ENV) or "{}").get("runtime_env") or {}
    job_vars = job_env.get("env_vars") or {}
    settings = environ[SETTINGS_ENV]
    if job_vars.get(SETTINGS_ENV, settings) != settings:
        raise SystemExit(f"error: the job's runtime env sets {SETTINGS_ENV} to other settings than "
                         f"{SETTINGS_FLAG}'s file; leave it out of the job's env_vars")
    wanted = {key: environ.get(key, value) for key, value in RAY_ENV_DEFAULTS.items()} | {SETTINGS_ENV: settings}
    return {key: value for key, value in wanted.items() if key not in job_vars}


def main(argv: list[str] | None = None) -> None:
    settings_path, flags = split_argv(list(sys.argv[1:] if argv is None else argv))
    settings = json.loads(settings_path.read_text())
    os.environ[SETTINGS_ENV] = json.dumps(settings)

    import ray  # the openrlhf extra: only the launched process needs it

    from ragen2.engines.openrlhf import trainer_patch  # imports OpenRLHF (the extra)

    trainer_patch.install()
    if not ray.is_initialized():  # train_ppo_ray would init Ray without our settings
        ray.init(runtime_env={"env_vars": runtime_env_vars()})
    sys.argv = ["openrlhf.cli.train_ppo_ray", *flags]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
