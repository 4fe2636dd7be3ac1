"""docs/custom_env.md's Python blocks run as pasted (issue 49, item 7: its first block once lacked
its imports): every ```python block, in order, in one fresh interpreter, from a folder holding the
worked example as guess_number.py (the page says to work from examples/). Only the model and the
run's size change: `ragen2.load_config` gets a tiny model and a one-step run appended to the
page's overrides, so the training block takes seconds."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "custom_env.md"
EXAMPLE = ROOT / "examples" / "guess_number.py"


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def test_the_blocks_are_found():
    python = blocks(DOC.read_text(), "python")
    assert len(python) >= 4 and python[0].startswith("from dataclasses import dataclass")
    assert blocks("```python\na = 1\n```\n```bash\nls\n```\n", "python") == ["a = 1\n"]


def test_the_pages_python_blocks_run_in_order_as_pasted(tmp_path, tiny_model_dir):
    text = DOC.read_text()
    python = blocks(text, "python")
    (yaml_block,) = blocks(text, "yaml")
    name = yaml_block.splitlines()[0].removeprefix("# ").strip()  # the block's first line names its file
    (tmp_path / name).write_text(yaml_block)
    (tmp_path / "guess_number.py").write_text(EXAMPLE.read_text())
    tiny = [f"model.name={tiny_model_dir}", "trainer.total_steps=1", f"trainer.out={tmp_path / 'runs'}",
            "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "trainer.val_groups=1",
            "probe.every=0", "optim.micro_batch_size=2", "optim.mini_batch_size=4"]
    preamble = textwrap.dedent(f"""\
        import ragen2
        _load_config = ragen2.load_config

        def _tiny(*args, overrides=(), **kwargs):  # the page's settings, then a tiny model and one step
            return _load_config(*args, overrides=[*overrides, *{tiny!r}], **kwargs)

        ragen2.load_config = _tiny
        """)
    # after the first block: the page's own class (not the example's) keeps the env contract
    check_first = "\nenvs.check_env(lambda: GuessNumber(GuessConfig()))\nprint('first block: check_env passed')\n"
    check_yaml = textwrap.dedent(f"""
        cfg = ragen2.load_config(env={name!r})
        print("yaml:", cfg.env.name, dict(cfg.env.overrides), cfg.rollout.max_turns)
        """)
    script = preamble + "\n" + python[0] + check_first + "\n".join(python[1:]) + check_yaml
    (tmp_path / "page.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "first block: check_env passed" in lines
    assert "the expert won 200 of 200 games" in lines
    assert any(line.startswith(str(tmp_path / "runs")) for line in lines)  # section 4's print of the run
    assert "yaml: guess_number:GuessNumber {'require_think': False} 4" in lines
