"""The memory-cgroup code on host kinds this machine may not be (cgroup v2 delegated, v1 hybrid,
none): a fake cgroupfs in a temp dir stands in for /sys/fs/cgroup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs.sandbox import memory, run_python


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_memory_cgroup_setup_and_accounting_on_either_hierarchy(tmp_path, monkeypatch, version):
    base = tmp_path / "cg" / "service"
    base.mkdir(parents=True)
    if version == "v2":
        (base / "cgroup.subtree_control").write_text("cpu memory pids\n")
        mounts, own = [(str(tmp_path / "cg"), "cgroup2", "rw")], {"": "/service"}
    else:
        (base / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        mounts, own = [(str(tmp_path / "cg"), "cgroup", "rw,memory")], {"memory": "/service"}
    monkeypatch.setattr(memory, "_mounts", lambda: mounts)
    monkeypatch.setattr(memory, "_own_cgroups", lambda: own)
    monkeypatch.setattr(memory, "_found", None)
    assert memory.available() == f"cgroup-{version}"
    # A real cgroupfs makes the control files itself; here the fake needs them to exist first.
    names = (["memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "memory.events", "memory.peak",
              "cgroup.kill"]
             if version == "v2" else ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control",
                                      "memory.max_usage_in_bytes"])
    real_mkdir = os.mkdir

    def mkdir(path, *args):
        real_mkdir(path, *args)
        for name in names:
            Path(path, name).write_text("")
    monkeypatch.setattr(memory.os, "mkdir", mkdir)
    run = memory.RunCgroup.create(256 * 2**20, 8)
    written = {name: Path(run.path, name).read_text() for name in names}
    total = str(256 * 2**20 + memory.HEADROOM)
    if version == "v2":
        assert (written["memory.max"], written["memory.swap.max"], written["memory.oom.group"],
                written["pids.max"]) == (total, "0", "1", "10")
        Path(run.path, "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
        Path(run.path, "memory.peak").write_text("283115520\n")
    else:
        assert written["memory.limit_in_bytes"] == written["memory.memsw.limit_in_bytes"] == total
        Path(run.path, "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
        Path(run.path, "memory.max_usage_in_bytes").write_text("283115520\n")
    assert run.procs == os.path.join(run.path, "cgroup.procs")
    assert run.usage() == {"oom_kills": 2, "peak_bytes": 283115520}
    assert run.remove(timeout=0) is False  # still has files: it reports, never raises
    if version == "v2":  # it asked the kernel to kill what was left before removing
        assert Path(run.path, "cgroup.kill").read_text() == "1"
    for name in os.listdir(run.path):  # a real cgroupfs lets rmdir take its files along
        os.unlink(os.path.join(run.path, name))
    assert run.remove(timeout=0) is True and not os.path.exists(run.path)


def test_no_writable_memory_cgroup_means_the_fallback(monkeypatch):
    monkeypatch.setattr(memory, "_mounts", lambda: [("/sys/fs/cgroup", "cgroup2", "rw")])
    monkeypatch.setattr(memory, "_own_cgroups", lambda: {"": "/no/such/cgroup"})
    monkeypatch.setattr(memory, "_found", None)
    assert memory.available() is None
    result = run_python("print(1)", memory_guard="cgroup")
    assert result.verdict == "sandbox_error" and "memory cgroup" in result.message
    result = run_python("print(1)")
    assert (result.verdict, result.memory_guard, result.memory_peak_bytes) == ("ok", "rlimits", 0)
