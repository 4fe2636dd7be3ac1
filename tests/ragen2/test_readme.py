"""The README's two set-up commands are what CI runs, verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_setup_commands():
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set up"):]
    commands = [line for line in re.findall(r"```bash\n(.*?)```", setup, re.S)[:2]]
    commands = [next(l for l in block.splitlines() if l.startswith("python3 -m venv")) for block in commands]
    ci = (ROOT / ".ci" / "run").read_text()
    assert len(commands) == 2
    assert "ragen2 train --filter snr-top-p" in commands[0] and commands[1].endswith("pytest")
    for command in commands:
        assert "pip install torch==2.13.0" in command  # the CPU build on disk, before anything pulls CUDA
        assert command in ci.splitlines()
