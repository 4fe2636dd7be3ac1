"""probe.dtype's default is the policy's compute dtype (issue 47: RAGEN-2 scores with the actor's
bf16 forward): a run on a CPU with bf16 units scores in bf16, one on a CPU without them in fp32
(the policy's precision there), and every probe row records which. The CPU's flags are hidden as
scripts/without_bf16.sh hides them: ragen2.precision reads a cpuinfo without bf16 flags."""

import pytest
import yaml

from ragen2 import precision
from ragen2.cli import main
from ragen2.config import ProbeSection, load_config
from ragen2.run_dir import read_metrics

pytestmark = pytest.mark.usefixtures("single_thread")

# /proc/cpuinfo flags lines: an AVX-512 Intel Xeon without bf16 units (issue 32 item 8's), an AMD
# EPYC with avx512_bf16 (this project's CI machine)
WITHOUT_BF16 = "flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni\n"
WITH_BF16 = "flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16\n"


def test_the_default_is_the_policys_compute_dtype():
    assert ProbeSection().dtype == "policy"
    assert load_config(env="bandit").probe.dtype == "policy"  # no preset or base.yaml sets it otherwise


def _probe_run(monkeypatch, cpuinfo: str, model_dir, out, *overrides) -> tuple[str, list[dict]]:
    """A 1-step run probing every step on a CPU reporting `cpuinfo`: (its resolved model.dtype, rows)."""
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: cpuinfo)
    uncached = getattr(precision._cpu_choice, "__wrapped__", precision._cpu_choice)
    monkeypatch.setattr(precision, "_cpu_choice", uncached)  # for this test only: the process's cache stays
    code = main(["train", "--quiet", "--env", "bandit", "--algo", "grpo", "--filter", "none", "--model",
                 str(model_dir), "--out", str(out), "--steps", "1", "trainer.run_name=r", "rollout.num_groups=3",
                 "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=1",
                 "trainer.val_before=false", "probe.every=1", "probe.segment=reply", *overrides])
    assert code == 0
    resolved = yaml.safe_load((out / "r" / "config.yaml").read_text())
    return resolved["model"]["dtype"], read_metrics(out / "r")


def test_without_bf16_units_the_default_scores_in_fp32_and_records_it(monkeypatch, tiny_model_dir, tmp_path):
    dtype, rows = _probe_run(monkeypatch, WITHOUT_BF16, tiny_model_dir, tmp_path / "default")
    assert dtype == "float32"  # model.dtype=auto: the policy computes in fp32 on this CPU
    (row,) = rows
    assert row["probe/dtype"] == "float32" and "probe/mi_estimate" in row
    # the same scores as asking for fp32: on this CPU the default is fp32 scoring, not a variant of it
    _, (asked,) = _probe_run(monkeypatch, WITHOUT_BF16, tiny_model_dir, tmp_path / "asked", "probe.dtype=float32")
    assert asked["probe/dtype"] == "float32"
    assert asked["probe/mi_estimate"] == row["probe/mi_estimate"]


def test_with_bf16_units_the_default_scores_in_bf16_and_records_it(monkeypatch, tiny_model_dir, tmp_path):
    dtype, (row,) = _probe_run(monkeypatch, WITH_BF16, tiny_model_dir, tmp_path / "default")
    assert dtype == "bfloat16" and row["probe/dtype"] == "bfloat16"
    _, (asked,) = _probe_run(monkeypatch, WITH_BF16, tiny_model_dir, tmp_path / "asked", "probe.dtype=float32")
    assert asked["probe/dtype"] == "float32"  # float32 stays available where the policy runs bf16
