"""End to end: `ragen2 train` on a tiny model saved to disk, through the real CLI.

The tiny model is a random Llama over a byte-level BPE with a ChatML template (built
in-process, saved with save_pretrained), so runs take seconds and need no hub.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen2 import heap
from ragen2.cli import main
from ragen2.run_dir import read_events, read_metrics

ROOT = Path(__file__).resolve().parents[4]
TINY = ["rollout.num_groups=3", "rollout.group_size=2", "rollout.max_new_tokens=10", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=2"]



def _train(argv, capsys=None):
    code = main(["train", "--quiet", *argv])
    return code


def _deterministic(rows):
    """Drop wall-clock figures: everything else must repeat exactly."""
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/")) and k != "probe/time_s"}
            for row in rows]


@pytest.mark.parametrize("algo, env, extra", [
    ("ppo", "bandit", []),
    ("grpo", "sokoban", []),
    ("ppo", "frozen_lake", ["rollout.context=window"]),
    ("grpo", "bandit", ["model.lora_rank=4"]),
    ("dr-grpo", "countdown", ["algo.kl_coef=0.01", "algo.kl_mode=reward"]),
    ("ppo", "sokoban", ["algo.advantage=bilevel_gae", "algo.kl_coef=0.01"]),
])
def test_a_few_steps_write_metrics_summary_and_checkpoint(tiny_model_dir, tmp_path, algo, env, extra, capsys):
    code = _train(["--env", env, "--algo", algo, "--filter", "none", "--model", str(tiny_model_dir),
                   "--out", str(tmp_path), "--steps", "2", "trainer.run_name=r", "rollout.max_turns=2", *TINY,
                   *extra])
    assert code == 0
    run = tmp_path / "r"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1]
    for key in ("rollout/reward_mean", "rollout/in_group_reward_variance_mean", "snr/kept_fraction",
                "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/clipfrac_high", "time/rollout_s",
                "time/update_s", "throughput/update_tokens_per_s"):
        assert key in rows[0], key
    assert ("critic/value_loss" in rows[0]) == (algo == "ppo")
    # A reference model exists only with a KL term; the first update moves the policy off it.
    with_kl = algo == "grpo" or any("kl_coef" in item for item in extra)  # the grpo preset has a KL loss
    assert rows[0]["update/kl_to_ref"] == 0.0 and (rows[1]["update/kl_to_ref"] > 0.0) == with_kl
    assert "val/success_rate" in rows[-1] and "val/pass@2" in rows[-1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["steps_trained"] == 2
    assert (run / "checkpoints" / "step_000002" / "state.json").is_file()
    assert "results: " in capsys.readouterr().out


def test_bad_config_fails_before_any_model_loads(tmp_path, capsys):
    assert main(["train", "--model", str(tmp_path / "missing"), "rollout.group_sise=4"]) == 2
    err = capsys.readouterr().err
    assert "rollout.group_sise: unknown key" in err and "group_size" in err
    assert main(["train", "--filter", "snr-top-q"]) == 2
    assert "unknown filter preset 'snr-top-q'" in capsys.readouterr().err


def test_all_zero_spread_skips_every_step_and_stops(tiny_model_dir, tmp_path):
    # A random tiny model never writes the format: every reward is the -0.1 penalty, so
    # every group has zero spread and snr-top-p keeps nothing.
    code = _train(["--filter", "snr-top-p", "--model", str(tiny_model_dir), "--out", str(tmp_path), "--steps", "10",
                   "trainer.run_name=z", "stop.max_consecutive_skips=3", *TINY])
    assert code == 0
    rows = read_metrics(tmp_path / "z")
    assert len(rows) == 3 and all(r["snr/skipped"] == 1.0 for r in rows)
    assert rows[-1]["stop_reason"] == "consecutive_skips"
    assert not any("actor/pg_loss" in r for r in rows)
    events = [json.loads(line) for line in (tmp_path / "z" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "stop" and "3" in e["message"] for e in events)


def test_sigkill_then_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    # The thread count shapes a run's numbers; pinned, the in-process reference and the child agree
    # whatever threads this test process happens to run.
    common = ["--model", str(tiny_model_dir), "--filter", "none", "--algo", "ppo", "--steps", "5",
              "trainer.save_every=1", "rollout.max_new_tokens=24", "trainer.num_threads=2", *TINY]
    assert _train(["--out", str(tmp_path), "trainer.run_name=full", *common]) == 0
    reference = _deterministic(read_metrics(tmp_path / "full"))

    run = tmp_path / "killed"
    command = [sys.executable, "-m", "ragen2.cli", "train", "--quiet", "--out", str(tmp_path),
               "trainer.run_name=killed", *common]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONHASHSEED": "123"})
    deadline = time.time() + 900  # a loaded machine starts the child slowly; only the order of events matters
    while not (run / "checkpoints" / "step_000002" / "state.json").exists():
        assert process.poll() is None, "training exited before it could be killed"
        assert time.time() < deadline, "no checkpoint within the time limit"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run / "summary.json").exists()

    assert main(["train", "--quiet", "--resume", str(run)]) == 0
    assert _deterministic(read_metrics(run)) == reference
    # The child kept its freed memory (ragen2.heap), the in-process runs did not: the allocation
    # policy leaves the numbers as they were.
    heap_lines = [e["message"] for e in read_events(run) if e["kind"] == "heap"]
    assert heap_lines[0].startswith("freed memory kept") or heap._glibc() is None
    assert heap_lines[-1] == heap.state()
