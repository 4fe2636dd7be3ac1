"""wandb as users expect it: their login and WANDB_* variables decide the mode, the config names
the project/run/entity/tags, and --resume continues the same wandb run (a stand-in module
records what `wandb.init` was given; nothing is sent anywhere)."""

import sys
import types

import pytest

from ragen2 import wandb_log
from ragen2.cli import main
from ragen2.run_dir import read_completions
from ragen2.run_dir import read_metrics

TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0", "trainer.num_threads=1"]


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    calls = []

    class Run:
        def __init__(self, kwargs):
            self.kwargs, self.logged = kwargs, []

        def log(self, values, step):
            self.logged.append((step, values))

        def finish(self):
            pass

    def init(**kwargs):
        calls.append(Run(kwargs))
        return calls[-1]

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Table=Table))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: not logged in
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_without_a_login_or_a_mode_the_run_logs_offline(tmp_path, fake_wandb):
    kwargs = wandb_log.init_kwargs(tmp_path, {}, {})
    assert kwargs["mode"] == "offline" and kwargs["project"] == "ragen2" and kwargs["name"] == tmp_path.name


@pytest.mark.parametrize("variable, value", [("WANDB_MODE", "disabled"), ("WANDB_MODE", "online"),
                                             ("WANDB_API_KEY", "k" * 40)])
def test_the_users_wandb_settings_decide_the_mode(tmp_path, fake_wandb, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    assert "mode" not in wandb_log.init_kwargs(tmp_path, {}, {})  # wandb reads WANDB_MODE / the key itself


def test_wandb_login_counts_as_logged_in(tmp_path, fake_wandb):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (home / ".netrc").chmod(0o600)
    assert "mode" not in wandb_log.init_kwargs(tmp_path, {}, {})


def test_project_entity_name_and_tags_come_from_the_config_and_env_vars_win(tmp_path, fake_wandb, monkeypatch):
    trainer = {"wandb_project": "p", "wandb_entity": "lab", "wandb_name": "n", "wandb_tags": ["a", "b"]}
    kwargs = wandb_log.init_kwargs(tmp_path, {}, trainer)
    assert (kwargs["project"], kwargs["entity"], kwargs["name"], kwargs["tags"]) == ("p", "lab", "n", ["a", "b"])
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert wandb_log.init_kwargs(tmp_path, {}, trainer)["project"] == "from-env"


def test_a_resumed_run_continues_the_same_wandb_run(tiny_model_dir, tmp_path, fake_wandb):
    common = ["--model", str(tiny_model_dir), "--filter", "none", "--algo", "grpo", "trainer.wandb=true",
              "trainer.save_every=1", "trainer.wandb_tags=[cpu]", *TINY]
    assert main(["train", "--quiet", "--out", str(tmp_path), "trainer.run_name=r", "--steps", "1", *common]) == 0
    run = tmp_path / "r"
    assert main(["train", "--quiet", "--resume", str(run), "trainer.total_steps=2"]) == 0
    first, second = fake_wandb
    assert first.kwargs["id"] == second.kwargs["id"] and second.kwargs["resume"] == "allow"
    assert first.kwargs["tags"] == ["cpu"] and first.kwargs["config"]["trainer"]["wandb"] is True
    assert [step for step, _ in first.logged + second.logged] == [r["step"] for r in read_metrics(run)] == [0, 1]
    # trainer.log_completions (2 by default) goes out as a table in the step's one log call
    recorded = read_completions(run)
    for step, values in first.logged + second.logged:
        table = values["completions"]
        rows = [dict(zip(table.columns, row)) for row in table.data]
        assert [(r["step"], r["rank"], r["group"], r["member"], r["reward"]) for r in rows] == [
            (c["step"], c["rank"], c["group"], c["member"], c["reward"]) for c in recorded if c["step"] == step]
        assert [r["responses"] for r in rows] == [c["turns"][0]["response"] for c in recorded if c["step"] == step]
        assert [r["rank"] for r in rows] == ["best", "worst"]
