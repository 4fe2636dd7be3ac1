"""Rebuild a calibrated warm start from its committed commands, on any machine:

    python scripts/build_warm_start.py frozen_lake-none        # -> runs/warm/frozen_lake-none (a model)

NAME is ENV-REASONING of a result in docs/benchmarks/warm_start_calibration.json. Its
`warm_start_command` (`ragen2 demos` then `ragen2 sft --steps N`, N the calibrated step) is run
with the run directory set to runs/warm/NAME; the calibration's intermediate validations are left
out (they do not touch the weights). The policy checkpoint's sha256 is then compared with the one
the calibration recorded: equal on the same kind of CPU, thread count and dtype; elsewhere the
floating-point rounding differs and the script says so (the bench cells record which one they ran).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from ragen2.engines.local.sft import weights_digest

CALIBRATION = Path("docs/benchmarks/warm_start_calibration.json")
OUT = Path("runs/warm")


def policy_file(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}" / "policy" / "model.safetensors"


def rebuild_commands(result: dict, run_dir: Path) -> tuple[list[str], list[str]]:
    demos_part, sft_part = result["warm_start_command"].split(" && ")
    sft = [a for a in shlex.split(sft_part) if not a.startswith(("trainer.out=", "trainer.run_name=",
                                                                "trainer.val_every=", "trainer.save_every="))]
    sft += [f"trainer.out={run_dir.parent}", f"trainer.run_name={run_dir.name}", "trainer.val_every=0",
            "trainer.save_every=0"]
    if not any(a.startswith("sft.padding_free=") for a in sft):
        # calibrated before sft.padding_free existed: its steps ran the padded passes, and the
        # padding-free ones (today's default) round differently, so the weights would not match
        sft.append("sft.padding_free=false")
    return shlex.split(demos_part), sft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="ENV-REASONING, e.g. frozen_lake-none")
    parser.add_argument("--calibration", type=Path, default=CALIBRATION)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results = {f"{r['env']}-{r['reasoning']}": r for r in json.loads(args.calibration.read_text())["results"]}
    if args.name not in results:
        print(f"error: no calibrated warm start {args.name!r}; known: {sorted(results)}", file=sys.stderr)
        return 2
    result, run_dir = results[args.name], args.out / args.name
    if (run_dir / "summary.json").is_file():
        print(f"{run_dir} exists; remove it to rebuild", file=sys.stderr)
    else:
        for command in rebuild_commands(result, run_dir):
            print("$ " + shlex.join(command), file=sys.stderr, flush=True)
            subprocess.run(command, check=True)
    rebuilt = weights_digest(policy_file(run_dir, result["sft_steps"]))
    recorded = result.get("checkpoint_sha256")
    same = rebuilt == recorded
    print(json.dumps({"warm_start": str(run_dir), "checkpoint_sha256": rebuilt, "recorded": recorded,
                      "bit_identical": same}))
    if not same:
        print(f"note: the weights differ from the calibration's (made on {result['cpu'].get('cpu')}): another "
              "CPU kind, thread count, dtype or version of the code rounds differently; the cells record the "
              "digest they started from", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
