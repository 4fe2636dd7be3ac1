"""The main job (`ragen2 train --filter snr-top-p` on base.yaml: answer-only Bandit) shows both
instruments: the probe scores replies (answer-only has no reasoning), the untrained model is
validated first and the end says validation before → after."""

import json

import yaml

from ragen2.cli import main
from ragen2.config import load_config
from ragen2.instruments import probe as probe_lib
from ragen2.run_dir import read_events, read_metrics

TINY = ["rollout.num_groups=3", "rollout.group_size=2", "rollout.max_new_tokens=10", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=1", "probe.num_samples=4"]


def test_main_job_probes_replies_validates_before_and_prints_before_after(tiny_model_dir, tmp_path, capsys):
    code = main(["train", "--quiet", "--filter", "snr-top-p", "--model", str(tiny_model_dir), "--out", str(tmp_path),
                 "--steps", "2", "trainer.run_name=m", "filter.value=1.0", *TINY])
    assert code == 0
    run = tmp_path / "m"
    # auto resolved at start and recorded as resolved: a resume reads back what was scored
    assert yaml.safe_load((run / "config.yaml").read_text())["probe"]["segment"] == "reply"
    rows = read_metrics(run)
    # (a probe with no rows logs probe/num_pairs 0 and no MI: the reasoning segment here)
    assert all(row.get("probe/num_rows", 0) > 0 and "probe/mi_zscore_ema" in row for row in rows), rows
    before = [e for e in read_events(run) if e["kind"] == "validation_before"]
    assert len(before) == 1 and "val/success_rate" in before[0]["metrics"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_before_success_rate"] == before[0]["metrics"]["val/success_rate"]
    assert summary["val_success_change"] == round(summary["final_val_success_rate"]
                                                  - summary["val_before_success_rate"], 6)
    out = capsys.readouterr()
    expected = (f"validation success {summary['val_before_success_rate']:.3f} → "
                f"{summary['final_val_success_rate']:.3f} ({summary['val_success_change']:+.3f})")
    assert expected in out.out
    assert "dapo on bandit" in out.out  # the headline names the algorithm the run used
    assert "algo dapo (grpo advantage)" in out.err


def test_segment_auto_follows_whether_the_env_requires_think():
    answer_only = load_config()  # base.yaml: bandit with require_think=false
    assert answer_only.probe.segment == "auto"
    assert "reply" in probe_lib.resolve_run_segment(answer_only) and answer_only.probe.segment == "reply"
    think = load_config(env="bandit")
    probe_lib.resolve_run_segment(think)
    assert think.probe.segment == "reasoning"
    chosen = load_config(overrides=["probe.segment=reasoning"])  # a choice is kept, never re-decided
    assert probe_lib.resolve_run_segment(chosen) is None and chosen.probe.segment == "reasoning"


def test_val_before_is_on_for_the_cpu_default_and_off_in_bench_cells():
    assert load_config().trainer.val_before is True
    from ragen2.bench.suite import BENCH_DEFAULTS
    assert "trainer.val_before=false" in BENCH_DEFAULTS  # a suite has its own validate_before
