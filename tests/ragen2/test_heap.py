"""ragen2.heap: freed memory stays in the process where it says so, and only the entry points set it."""

import os
import subprocess
import sys

import pytest

from ragen2 import cli, heap
from ragen2.config import load_config
from ragen2.run_dir import read_events

# In a child of its own: the policy is process-wide, and this test process keeps glibc's defaults.
RESIDENT_AFTER_FREE = """
import sys
from ragen2 import heap
print(heap.keep_freed_memory())
if sys.argv[1:] == ["return"]:
    heap.return_freed_memory()
def resident_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
before = resident_mb()
block = b"\\x01" * (256 << 20)  # malloc'd and written: resident
del block  # freed
print(round(resident_mb() - before))
"""


def _resident_growth_after_free(env_extra: dict, *args: str) -> tuple[str, int]:
    env = {key: value for key, value in os.environ.items() if key != heap.OPT_OUT_ENV} | env_extra
    done = subprocess.run([sys.executable, "-c", RESIDENT_AFTER_FREE, *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    line, growth = done.stdout.strip().splitlines()
    return line, int(growth)


@pytest.mark.skipif(heap._glibc() is None, reason="the policy acts on glibc only")
def test_a_freed_block_stays_resident_when_kept_and_goes_back_when_opted_out():
    kept_line, kept_growth = _resident_growth_after_free({})
    assert kept_line.startswith("freed memory kept in the process")
    assert kept_growth > 200  # the 256 MiB block was freed into the heap, not unmapped
    default_line, default_growth = _resident_growth_after_free({heap.OPT_OUT_ENV: "1"})
    assert heap.OPT_OUT_ENV in default_line
    assert default_growth < 50  # glibc's default: a block this large is unmapped at free


@pytest.mark.skipif(heap._glibc() is None, reason="the policy acts on glibc only")
def test_return_freed_memory_undoes_the_policy():
    _, growth = _resident_growth_after_free({}, "return")
    assert growth < 50


def test_a_run_with_keep_freed_memory_false_returns_it(tiny_model_dir, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "return_freed_memory", lambda: calls.append(1) or "returned")
    monkeypatch.setattr(heap, "state", lambda: "returned" if calls else "kept")
    argv = ["train", "--quiet", "--model", str(tiny_model_dir), "--out", str(tmp_path), "--steps", "1",
            "trainer.run_name=r", "trainer.keep_freed_memory=false", "rollout.num_groups=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "trainer.val_groups=1", "trainer.val_before=false", "probe.every=0"]
    assert cli.main(argv) == 0
    assert calls == [1]
    assert [e["message"] for e in read_events(tmp_path / "r") if e["kind"] == "heap"] == ["returned"]


def test_the_long_row_presets_return_freed_memory_and_the_default_keeps_it():
    assert load_config().trainer.keep_freed_memory
    for env in ("sokoban", "frozen_lake"):
        assert not load_config(env=env).trainer.keep_freed_memory


def test_without_glibc_nothing_is_set(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    monkeypatch.setattr(heap, "_state", heap._state)  # restored after the test
    monkeypatch.delenv(heap.OPT_OUT_ENV, raising=False)
    assert heap.keep_freed_memory().startswith("not glibc")
    assert heap.state().startswith("not glibc")


def test_the_opt_out_calls_no_mallopt(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: pytest.fail("the opt-out must not touch the allocator"))
    monkeypatch.setattr(heap, "_state", heap._state)
    monkeypatch.setenv(heap.OPT_OUT_ENV, "1")
    assert heap.OPT_OUT_ENV in heap.keep_freed_memory()


def test_the_console_script_sets_the_policy_before_running_the_command(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append("heap") or "kept")
    monkeypatch.setattr(cli, "main", lambda argv=None: calls.append("main") or 0)
    assert cli.entry() == 0
    assert calls == ["heap", "main"]


def test_main_in_process_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: pytest.fail("main must not change the process's allocator"))
    with pytest.raises(SystemExit):
        cli.main(["--version"])
