"""An env of your own, from outside the package: the worked example (examples/guess_number.py) as a
module in a temporary folder passes check_env and trains from the CLI (`--env module:Class`) and
from Python (`ragen2.train`), on a tiny model."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import envs
import ragen2
from ragen2.run_dir import read_metrics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "guess_number.py"
TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_turns=3", "rollout.max_new_tokens=8",
        "trainer.val_groups=2", "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0"]


@pytest.fixture
def module_folder(tmp_path, request):
    """The example under a module name of this test's own, in a folder that is not the repository."""
    name = f"my_guess_{request.node.name.split('[')[0].removeprefix('test_')}"
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / f"{name}.py").write_text(EXAMPLE.read_text())
    return folder, name


def test_the_example_keeps_the_env_contract(module_folder, monkeypatch):
    folder, name = module_folder
    monkeypatch.syspath_prepend(str(folder))
    entry = envs.spec(f"{name}:GuessNumber")  # imports the module, which registers the class
    assert entry.env_cls.__module__ == name and entry.name == "guess_number"
    envs.check_env(lambda: entry.env_cls(entry.make_config(span=6)))


def test_an_unregistered_class_is_registered_under_its_reference(tmp_path, monkeypatch):
    (tmp_path / "bare_env_mod.py").write_text(EXAMPLE.read_text().replace("envs.register(", "print(") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = envs.spec("bare_env_mod:GuessNumber")
    assert entry.name == "bare_env_mod:GuessNumber" and entry.description.startswith("Guess a secret number")
    assert envs.spec("Bare_Env_Mod:GuessNumber") is entry
    with pytest.raises(envs.EnvConfigError, match="bare_env_mod has no TextEnv subclass named 'GuessConfig'"):
        envs.spec("bare_env_mod:GuessConfig")
    with pytest.raises(envs.EnvConfigError, match="cannot import no_such_module_here"):
        envs.spec("no_such_module_here:Env")


def test_a_typo_in_an_env_name_gets_a_did_you_mean():
    with pytest.raises(envs.EnvConfigError, match=r"unknown env 'sokobn' \(did you mean sokoban\?\)"):
        envs.spec("sokobn")
    with pytest.raises(ragen2.ConfigError, match=r"unknown env 'frozenlak' \(did you mean frozen_lake\?\)"):
        ragen2.load_config(env="frozenlak")


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "ragen2"  # the console script: sys.path[0] is its bin folder
    return [str(script)] if script.is_file() else [sys.executable, "-c", "import sys; from ragen2.cli import main; "
                                                                          "sys.exit(main())"]


def test_train_from_the_cli_with_env_module_class(module_folder, tiny_model_dir, tmp_path):
    folder, name = module_folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([*_cli(), "train", "--quiet", "--env", f"{name}:GuessNumber", "--env-arg", "span=4",
                          "--model", str(tiny_model_dir), "--out", str(tmp_path / "runs"), "--steps", "2",
                          "trainer.run_name=cli", *TINY],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "cli"
    assert [row["step"] for row in read_metrics(run)] == [0, 1]
    saved = yaml.safe_load((run / "config.yaml").read_text())["env"]
    assert saved == {"name": f"{name}:GuessNumber", "overrides": {"span": 4}, "val_name": None}  # a resume re-imports it
    assert f"env {name}:GuessNumber | algo dapo" in out.stderr


def test_a_run_of_an_env_of_your_own_is_named_after_its_class(module_folder, monkeypatch):
    from ragen2.commands.train import run_directory

    folder, name = module_folder
    monkeypatch.syspath_prepend(str(folder))
    cfg = ragen2.load_config(env=f"{name}:GuessNumber")
    assert "-GuessNumber-dapo-none-s0" in run_directory(cfg).name and ":" not in str(run_directory(cfg))


def test_train_from_python(module_folder, tiny_model_dir, tmp_path, monkeypatch):
    folder, name = module_folder
    monkeypatch.syspath_prepend(str(folder))
    cfg = ragen2.load_config(env=f"{name}:GuessNumber", algo="grpo",
                             overrides=[f"model.name={tiny_model_dir}", f"trainer.out={tmp_path}", "trainer.total_steps=2",
                                        *TINY])
    summary = ragen2.train(cfg, run_dir=tmp_path / "py")
    assert (summary["steps"], summary["run_dir"]) == (2, str(tmp_path / "py"))
    rows = read_metrics(tmp_path / "py")
    assert rows[-1]["rollout/turns_mean"] >= 1 and "val/success_rate" in rows[-1]
    with pytest.raises(TypeError, match="not both"):
        ragen2.train(cfg, env="bandit")
