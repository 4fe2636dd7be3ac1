"""One bench cell in its own process: `python -m ragen2.bench.worker RUN_DIR [--engine NAME]`.

The parent (ragen2.bench.runner) writes RUN_DIR/config.yaml first; this reads it, trains (or
continues from the latest checkpoint), and exits 0 when summary.json is written. With
`--validate-before` (the suite's `validate_before`), a cell that has not trained yet first
validates the untrained model into RUN_DIR/bench_val_before.json, or copies a sibling cell's
validation of the same inputs (model, env, rollout, seed, validation settings: the arms of a
seed that differ only in how they train). On an error it
writes RUN_DIR/bench_error.json (type, message, traceback) so the parent can show the reason,
and exits 1. Output goes wherever the parent points stdout/stderr (RUN_DIR/bench_output.log).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from importlib.util import find_spec
from pathlib import Path

from ragen2.config import saved_config
from ragen2.run_dir import CONFIG_FILE, SUMMARY_FILE, read_summary

ERROR_FILE = "bench_error.json"
VAL_BEFORE_FILE = "bench_val_before.json"  # validation metrics of the untrained model
ENGINES = ("local", "openrlhf")


class EngineUnavailable(RuntimeError):
    pass


def val_before(run_dir: Path) -> dict:
    """Validation metrics of the untrained model, where the suite asked for them (validate_before)."""
    path = Path(run_dir) / VAL_BEFORE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def validation_inputs(cfg) -> dict:
    """What validating the untrained model depends on: the same inputs give the same instances and,
    on one machine, the same sampled episodes (validation seeds its own generator)."""
    sections = json.loads(cfg.model_dump_json())
    return {"model": sections["model"], "env": sections["env"], "rollout": sections["rollout"],
            "seed": cfg.trainer.seed, "val_groups": cfg.trainer.val_groups,
            "val_temperature": cfg.trainer.val_temperature}


def sibling_val_before(run_dir: Path, cfg) -> dict | None:
    """A validation of the untrained model that a sibling cell already made on the same inputs,
    with `validated_in` naming that cell; None when there is none."""
    wanted = validation_inputs(cfg)
    for sibling in sorted(Path(run_dir).parent.iterdir()):
        source = sibling / VAL_BEFORE_FILE
        if sibling == Path(run_dir) or not source.is_file() or not (sibling / CONFIG_FILE).is_file():
            continue
        try:
            same = validation_inputs(saved_config(sibling / CONFIG_FILE)) == wanted
        except Exception:  # noqa: BLE001 - a sibling with an unreadable config is simply not a match
            continue
        if same:
            metrics = json.loads(source.read_text())
            return {**metrics, "validated_in": metrics.get("validated_in", sibling.name)}
    return None


def _openrlhf_installed() -> bool:
    return find_spec("openrlhf") is not None  # without importing it (Ray, vLLM, DeepSpeed are heavy)


def openrlhf_run():
    """`ragen2.engines.openrlhf.launch.run(cfg, run_dir, args) -> exit status`, or EngineUnavailable.

    Checked in the parent before any cell starts, so a machine without the engine fails once,
    clearly, instead of once per cell.
    """
    try:
        launch = importlib.import_module("ragen2.engines.openrlhf.launch")
    except ImportError as error:
        raise EngineUnavailable(f"--engine openrlhf: the OpenRLHF engine is not importable ({error})") from None
    if not callable(getattr(launch, "run", None)):
        raise EngineUnavailable("--engine openrlhf: ragen2.engines.openrlhf.launch has no run(cfg, run_dir, args)")
    if not _openrlhf_installed():
        raise EngineUnavailable('--engine openrlhf needs the extra: pip install "ragen2[openrlhf]" (OpenRLHF 0.11.2, '
                                "Ray, vLLM, DeepSpeed; a GPU machine), or drop --engine")
    return launch.run


def run_cell(run_dir: Path, engine: str = "local", quiet: bool = False, cluster: dict | None = None,
             validate_before: bool = False) -> dict:
    """Train the run whose config.yaml is in run_dir, resuming when it can; returns the summary.

    `cluster` ({"nodes", "gpus_per_node", "vllm_tp"}) goes to the OpenRLHF engine.
    `validate_before` (local engine only) validates the untrained model first, once: a cell
    resumed from a checkpoint has trained already, and a saved validation is not repeated.
    """
    cfg = saved_config(run_dir / CONFIG_FILE)
    if engine == "openrlhf":
        options = {"nodes": 1, "gpus_per_node": 8, "vllm_tp": 1, **(cluster or {})}
        status = openrlhf_run()(cfg, run_dir, argparse.Namespace(dry_run=False, **options))
        if status != 0:
            raise RuntimeError(f"the OpenRLHF engine exited with status {status}")
        summary = read_summary(run_dir)
        if summary is None:  # the report reads it, and the metrics
            raise RuntimeError(f"the OpenRLHF run finished without writing {SUMMARY_FILE} into its run directory")
        return summary
    from ragen2.engines.local import trainer  # torch: only in the process that trains (the bench parent imports this module)

    run = trainer.setup(cfg, run_dir, resume=True, quiet=quiet)
    before = run_dir / VAL_BEFORE_FILE
    if validate_before and run.state.step == 0 and not before.is_file():
        # its own sampling generator: validating first leaves the training run as it would have been
        metrics = sibling_val_before(run_dir, cfg) or trainer.validate(run)
        before.write_text(json.dumps(metrics, indent=1))
    return trainer.train(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--engine", choices=ENGINES, default="local")
    parser.add_argument("--threads", type=int, help="torch threads")
    parser.add_argument("--cluster", type=json.loads, default={}, help="OpenRLHF cluster options as JSON")
    parser.add_argument("--validate-before", action="store_true", help="validate the untrained model first")
    args = parser.parse_args(argv)
    (args.run_dir / ERROR_FILE).unlink(missing_ok=True)
    try:
        if args.threads:
            import torch  # only in the process that trains, as trainer above

            torch.set_num_threads(args.threads)
        run_cell(args.run_dir, args.engine, cluster=args.cluster, validate_before=args.validate_before)
    except Exception as error:  # noqa: BLE001 - any failure is this cell's, reported to the parent
        (args.run_dir / ERROR_FILE).write_text(json.dumps({
            "type": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}, indent=1))
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    from ragen2 import heap  # a cell's own process: its allocator keeps freed memory (ragen2.heap)

    heap.keep_freed_memory()
    sys.exit(main())
