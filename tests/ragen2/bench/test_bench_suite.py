"""Bench suites: matrix expansion (hand-counted cells and their overrides), up-front validation,
and the suite-level `validate_before` on real tiny cells."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from ragen2.bench.suite import SuiteError, expand, load_suite
from ragen2.cli import main
from ragen2.config import load_config

ROOT = Path(__file__).resolve().parents[3]

SUITE = {
    "name": "t",
    "seeds": [0, 1],
    "overrides": ["trainer.total_steps=2", "rollout.num_groups=3"],
    "matrices": [
        {"name": "a", "algos": ["grpo", "ppo"], "filters": ["none", "snr-top-p"], "envs": [None],
         "overrides": ["rollout.max_new_tokens=16"]},
        {"name": "b", "algos": ["starpo-s"], "envs": ["bandit"], "seeds": [3],
         "variants": {"top25": ["filter.value=0.25"], "top50": ["filter.value=0.5"]},
         "baseline": "starpo-s/top50"},
    ],
}


def write(tmp_path, data, name="suite.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_matrix_expands_to_the_hand_counted_cells(tmp_path):
    suite = load_suite(write(tmp_path, SUITE))
    cells = expand(suite, tmp_path / "out", ["optim.actor_lr=3e-5"])
    # a: 2 seeds x 1 env x 2 algos x 2 filters = 8, seed-major; b: 1 seed x 2 variants = 2
    assert [c.name for c in cells] == [
        "a--bandit--grpo--none--s0", "a--bandit--grpo--snr-top-p--s0",
        "a--bandit--ppo--none--s0", "a--bandit--ppo--snr-top-p--s0",
        "a--bandit--grpo--none--s1", "a--bandit--grpo--snr-top-p--s1",
        "a--bandit--ppo--none--s1", "a--bandit--ppo--snr-top-p--s1",
        "b--bandit--starpo-s--starpo-s--top25--s3", "b--bandit--starpo-s--starpo-s--top50--s3",
    ]
    first = cells[0]
    # The overrides in layering order: bench default, suite, matrix, --set, seed, run directory.
    assert first.overrides == ["trainer.keep_last=1", "trainer.val_before=false", "probe.every=5", "trainer.total_steps=2", "rollout.num_groups=3",
                               "rollout.max_new_tokens=16", "optim.actor_lr=3e-5", "trainer.seed=0",
                               f"trainer.out={tmp_path / 'out'}/runs", "trainer.run_name=a--bandit--grpo--none--s0"]
    assert first.run_dir == tmp_path / "out" / "runs" / first.name
    for cell in cells:  # the recorded presets + overrides rebuild exactly the config the cell runs
        assert load_config(**cell.presets, overrides=cell.overrides).to_yaml() == cell.config.to_yaml()
    cfg = first.config
    assert (cfg.trainer.total_steps, cfg.rollout.num_groups, cfg.rollout.max_new_tokens, cfg.optim.actor_lr,
            cfg.trainer.keep_last) == (2, 3, 16, 3e-5, 1)
    assert cfg.env.overrides == {"require_think": False}  # null env = base.yaml's answer-only bandit
    ppo_filtered = cells[3].config
    assert ppo_filtered.algo.advantage == "gae" and ppo_filtered.filter.strategy == "top_p"
    assert ppo_filtered.filter.value == 0.9 and ppo_filtered.trainer.seed == 0
    assert cells[5].config.trainer.seed == 1 and cells[5].config.algo.name == "grpo"
    top25, top50 = cells[8].config, cells[9].config
    # Matrix b: the env preset (think mode), no matrix-a override, the variant on top of the algo's filter.
    assert top25.env.overrides == {} and top25.rollout.max_new_tokens == 96
    assert (top25.filter.strategy, top25.filter.metric, top25.filter.value) == ("top_k", "reward_std", 0.25)
    assert top50.filter.value == 0.5 and top50.trainer.seed == 3 and top50.rollout.num_groups == 3
    assert [c.treatment for c in cells[:2]] == ["none", "snr-top-p"]
    assert [c.treatment for c in cells[8:]] == ["starpo-s/top25", "starpo-s/top50"]
    assert {c.baseline for c in cells[:8]} == {"none"} and cells[8].baseline == "starpo-s/top50"
    assert [c.row for c in cells[:4]] == ["grpo", "grpo", "ppo", "ppo"]


def test_compare_algo_puts_algorithms_in_the_columns(tmp_path):
    data = {"name": "s", "seeds": [0], "matrices": [
        {"name": "m", "compare": "algo", "algos": ["starpo", "starpo-s"], "envs": ["bandit", "sokoban"]}]}
    cells = expand(load_suite(write(tmp_path, data)), tmp_path / "out")
    assert len(cells) == 4
    assert [c.treatment for c in cells] == ["starpo", "starpo-s"] * 2
    assert {c.row for c in cells} == {"all"} and {c.baseline for c in cells} == {"starpo"}
    assert [c.filter for c in cells[:2]] == ["none", "starpo-s"]  # each algo preset's own filter
    assert cells[1].config.filter.value == 0.25 and cells[2].config.rollout.max_turns == 5  # sokoban preset


def test_scale_config_sets_the_scale_but_not_the_algorithm(tmp_path):
    scale = tmp_path / "paper.yaml"
    scale.write_text(yaml.safe_dump({
        "model": {"name": "org/some-model", "dtype": "bfloat16"}, "rollout": {"group_size": 8, "max_turns": 5},
        "algo": {"name": "ppo", "advantage": "gae"}, "filter": {"strategy": "top_k"},
        "optim": {"betas": [0.9, 0.95]}, "trainer": {"total_steps": 200}}))
    data = {"name": "s", "seeds": [0], "scale_config": str(scale), "overrides": ["trainer.total_steps=7"],
            "matrices": [{"name": "m", "algos": ["dr-grpo"], "filters": ["none"], "envs": ["countdown"]}]}
    cfg = expand(load_suite(write(tmp_path, data)), tmp_path / "out")[0].config
    assert cfg.algo.advantage == "dr_grpo" and cfg.filter.strategy == "none"  # the matrix's presets stay
    assert (cfg.model.name, cfg.model.dtype, cfg.rollout.group_size, cfg.rollout.max_turns) == (
        "org/some-model", "bfloat16", 8, 5)
    assert cfg.optim.betas == (0.9, 0.95)
    assert cfg.trainer.total_steps == 7  # suite overrides come after the scale config


def test_bundled_suites_expand_to_their_documented_sizes():
    sizes = {"main-table": 96, "starpo-s": 60, "top-p-sweep": 36, "cpu-smoke": 6,
             "filter-comparison-bandit": 32, "dapo-dynamic-bandit": 24}
    for name, size in sizes.items():
        cells = expand(load_suite(name), Path("/tmp/unused"))
        assert len(cells) == size, name
    main = expand(load_suite("main-table"), Path("/tmp/unused"))
    # the table's algorithm rows ran on the base model (RAGEN's run_main_table_diff_algo.sh)
    assert {c.config.model.name for c in main} == {"Qwen/Qwen2.5-3B"}
    assert {c.config.algo.name for c in main} == {"ppo", "ragen2-dapo", "ragen2-grpo", "ragen2-dr-grpo"}
    # RAGEN-2's filter column: top-p 0.9 in softmax mode over the reward std, zero-spread groups kept
    kept = {(c.config.filter.strategy, c.config.filter.value, c.config.filter.top_p_mode, c.config.filter.metric)
            for c in main if c.config.filter_preset == "ragen2-main"}
    assert kept == {("top_p", 0.9, "softmax", "reward_std")}
    assert all(c.config.algo.kl_coef == 0.0 and c.config.algo.dual_clip == 3.0 for c in main)
    assert {c.config.env.name for c in main} == {"sokoban", "frozen_lake", "metamathqa", "countdown"}
    smoke = expand(load_suite("cpu-smoke"), Path("/tmp/unused"))
    assert {c.config.model.name for c in smoke} == {"bundled"}
    assert all(c.config.trainer.total_steps <= 4 and c.config.rollout.num_groups * c.config.rollout.group_size <= 16
               for c in smoke)
    assert any(c.config.probe.every > 0 and c.config.env.overrides.get("require_think", True) for c in smoke)
    dynamic = expand(load_suite("dapo-dynamic-bandit"), Path("/tmp/unused"))
    assert {(c.config.filter_preset, c.config.filter.max_rounds) for c in dynamic} == {
        ("none", 1), ("snr-top-p", 1), ("dapo-dynamic", 4)}
    sweep = expand(load_suite("top-p-sweep"), Path("/tmp/unused"))
    assert sorted({c.config.filter.value for c in sweep}) == [0.6, 0.8, 0.9, 0.95, 0.98, 1.0]


def test_filter_comparison_bandit_is_issue_32s_claim_1_setting():
    suite = load_suite("filter-comparison-bandit")
    cells = expand(suite, Path("/tmp/unused"))
    assert suite.validate_before and suite.data["equal_budgets"] == ["env_episodes", "optimizer_steps_per_trained_step"]
    arms = ["none", "starpo-s", "snr-top-p", "snr-top-p-std"]
    assert [(c.filter, c.seed) for c in cells] == [(f, s) for s in range(8) for f in arms]  # seeds 0-7, paired
    filters = {c.filter: c.config.filter for c in cells}
    assert (filters["snr-top-p"].metric, filters["snr-top-p-std"].metric) == ("reward_variance", "reward_std")
    for cell in cells:
        c = cell.config
        assert (c.env.name, c.env.overrides.get("require_think"), c.rollout.max_turns) == ("bandit", False, 1)
        assert (c.algo.name, c.rollout.num_groups, c.rollout.group_size, c.trainer.total_steps) == (
            "ragen2-dr-grpo", 8, 4, 15)
        # one optimiser step per trained step: a mini-batch holds the whole rollout, and a filtered
        # batch (never padded: batch_adjust none) is no larger
        assert c.optim.mini_batch_size == c.rollout.num_groups * c.rollout.group_size and c.optim.ppo_epochs == 1
        assert c.optim.batch_adjust == "none"
        assert (c.stop.max_consecutive_skips, c.stop.spread_patience, c.stop.low_val_patience) == (0, 0, 0)
        assert not (c.probe.stop_on_collapse or c.probe.stop_on_early_warning)
        # validation on 32 x 4 at T = 0.5 after steps 8 and 15 (the trainer validates when
        # (step + 1) % val_every == 0, and at the last step)
        assert (c.trainer.val_groups, c.trainer.val_temperature) == (32, 0.5)
        assert [s + 1 for s in range(15) if (s + 1) % c.trainer.val_every == 0 or s == 14] == [8, 15]


def test_warm_start_frozen_lake_runs_the_design_its_file_states():
    suite = load_suite("warm-start-frozen-lake")
    cells = expand(suite, Path("/tmp/unused"))
    arms = ["none", "starpo-s", "snr-top-p", "ragen2-main"]
    assert [(c.filter, c.seed) for c in cells] == [(f, s) for s in range(8) for f in arms]  # seed by seed, paired
    assert suite.validate_before
    for cell in cells:
        c = cell.config
        assert (c.model.name, c.model.dtype) == ("runs/warm/frozen_lake-grounded", "bfloat16")
        assert (c.env.name, c.algo.name, c.algo.advantage) == ("frozen_lake", "ppo", "gae")
        assert (c.trainer.total_steps, c.rollout.num_groups, c.rollout.group_size) == (10, 8, 4)
        assert c.optim.mini_batch_size == 32 and c.optim.batch_adjust == "none"
        assert (c.stop.max_consecutive_skips, c.stop.spread_patience, c.stop.low_val_patience) == (0, 0, 0)
        assert (c.trainer.val_groups, c.trainer.val_temperature, c.trainer.val_every) == (32, 0.5, 0)


def test_main_table_runs_the_paper_configs_steps_and_its_comment_says_so():
    import re

    import yaml

    from ragen2.config import CONFIG_DIR

    paper = yaml.safe_load((CONFIG_DIR / "paper" / "ragen2-main.yaml").read_text())["trainer"]["total_steps"]
    cells = expand(load_suite("main-table"), Path("/tmp/unused"))
    assert {c.config.trainer.total_steps for c in cells} == {paper} == {400}
    stated = re.findall(r"cells of (\d+) steps", (CONFIG_DIR / "bench" / "main-table.yaml").read_text())
    assert stated == [str(paper)]


@pytest.mark.parametrize("change, message", [
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": [None], "filtres": ["none"]}]},
     "matrices[0]: unknown key(s) ['filtres']"),
    ({"seedz": [0]}, "unknown key(s) ['seedz']"),
    ({"matrices": [{"name": "a", "algos": ["ppo2"], "envs": [None]}]}, "unknown algo preset 'ppo2'"),
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": [None], "overrides": ["rollout.top_p=2"]}]},
     "rollout.top_p must be in (0, 1], got 2.0"),
    ({"overrides": ["trainer.total_stepz=2"]}, "trainer.total_stepz: unknown key"),
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": [None], "baseline": "snr"}]},
     "baseline: 'snr' is not one of this matrix's treatments ['none']"),
    ({"matrices": [{"name": "a", "algos": ["ppo", "ppo"], "envs": [None]}]}, "matrices[0].algos: repeated values"),
    ({"seeds": [], "matrices": [{"name": "a", "algos": ["ppo"], "envs": [None]}]}, "seeds: must list at least one"),
    ({"published": "nope"}, "unknown published setting 'nope'"),
    ({"equal_budgets": ["episodes"]}, "equal_budgets: unknown budget(s) ['episodes']"),
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": [None], "compare": "env"}]}, "compare: 'env' is not one"),
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": [None], "variants": {"v": ["oops"]}}]},
     "variants.v: 'oops' is not KEY=VALUE"),
    ({"matrices": [{"name": "a", "algos": ["ppo"], "envs": ["atari"]}]}, "unknown env 'atari'; registered envs"),
    ({"validate_before": "yes"}, "validate_before: expected bool, got str"),
])
def test_bad_suites_fail_naming_the_key(tmp_path, change, message):
    data = {"name": "t", "seeds": [0], "matrices": [{"name": "a", "algos": ["ppo"], "envs": [None]}], **change}
    with pytest.raises(SuiteError) as error:
        expand(load_suite(write(tmp_path, data)), tmp_path / "out")
    assert message in str(error.value)


def test_two_cells_with_one_name_are_refused(tmp_path):
    # A filter given as a path is labelled by its file name: a copy of none.yaml collides with `none`.
    copy = tmp_path / "none.yaml"
    copy.write_text((ROOT / "snr/presets/none.yaml").read_text())
    data = {"name": "t", "seeds": [0], "matrices": [
        {"name": "a", "algos": ["ppo"], "filters": ["none", str(copy)], "envs": [None]}]}
    with pytest.raises(SuiteError, match="two cells are both named 'bandit--ppo--none--s0'"):
        expand(load_suite(write(tmp_path, data)), tmp_path / "out")


def test_cli_list_shows_cells_and_a_bad_suite_is_one_line(tmp_path, capsys):
    path = write(tmp_path, SUITE)
    assert main(["bench", path, "--out", str(tmp_path / "o"), "--list"]) == 0
    out = capsys.readouterr().out
    assert "10 cells" in out and "[new    ] a--bandit--ppo--snr-top-p--s1" in out
    assert "filter top_p 0.9 by reward_variance" in out
    assert not (tmp_path / "o").exists()  # listing writes nothing
    assert main(["bench", "no-such-suite", "--list"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'no-such-suite'" in err and "cpu-smoke" in err and "Traceback" not in err


TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0", "trainer.total_steps=2"]


def _tiny_suite(tmp_path, model, **keys) -> str:
    data = {"name": "t", "seeds": [0], "overrides": TINY, **keys, "matrices": [
        {"name": "m", "algos": ["grpo"], "filters": ["none"], "envs": [None], "models": [str(model)]}]}
    return write(tmp_path, data, f"suite-{len(keys)}.yaml")


def test_validate_before_measures_the_untrained_model_and_leaves_training_as_it_was(tmp_path, tiny_model_dir,
                                                                                     monkeypatch):
    import torch

    from ragen2.engines.local import trainer
    from ragen2.config import build_config
    from ragen2.run_dir import read_metrics

    torch.set_num_threads(1)
    validate, seen = trainer.validate, []  # (step, sum of the policy's weights) at every validation

    def weights(model) -> float:
        return float(sum(p.detach().double().sum() for p in model.parameters()))

    def spy(run):
        seen.append((run.state.step, weights(run.services.models.policy)))
        return validate(run)

    monkeypatch.setattr(trainer, "validate", spy)
    cells = {}
    for before_first in (False, True):
        seen.clear()
        out = tmp_path / f"bench-{before_first}"
        suite = _tiny_suite(tmp_path, tiny_model_dir, **({"validate_before": True} if before_first else {}))
        assert main(["bench", suite, "--out", str(out), "--in-process", "--plain", "--no-plots"]) == 0
        cells[before_first] = out / "runs" / "bandit--grpo--none--s0"
    assert not (cells[False] / "bench_val_before.json").exists()
    before = json.loads((cells[True] / "bench_val_before.json").read_text())

    # the first validation ran before any update, on the weights a fresh set-up of the config has
    cfg = build_config(yaml.safe_load((cells[True] / "config.yaml").read_text()))
    fresh_run = trainer.setup(cfg, tmp_path / "fresh", quiet=True)
    fresh = weights(fresh_run.services.models.policy)
    assert seen[0] == (0, fresh) and len(seen) == 2 and seen[1][1] != fresh  # then the final one, trained
    untimed = lambda metrics: {k: v for k, v in metrics.items() if not k.startswith("time/")}  # noqa: E731
    assert untimed(before) == untimed(validate(fresh_run)) and before["val/num_groups"] == 2

    # validating first moved no random stream: both cells trained alike, step for step
    def trained(run_dir):
        return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))}
                for row in read_metrics(run_dir)]
    assert len(trained(cells[True])) == 2 and trained(cells[True]) == trained(cells[False])

    out = cells[True].parents[1]
    row = next(csv.DictReader((out / "results.csv").open()))
    assert float(row["val_success_before"]) == before["val/success_rate"]
    assert float(row["update_s"]) > 0 and float(row["rollout_s"]) > 0
    assert "| val before |" in (out / "report.md").read_text()
    assert json.loads((out / "bench.json").read_text())["validate_before"] is True


def test_validate_before_is_refused_with_the_openrlhf_engine(tmp_path, capsys):
    suite = _tiny_suite(tmp_path, "bundled", validate_before=True)
    assert main(["bench", suite, "--out", str(tmp_path / "o"), "--engine", "openrlhf"]) == 2
    assert "validate_before runs on the local engine only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_arms_of_a_seed_share_one_validation_of_the_untrained_model(tmp_path, tiny_model_dir, monkeypatch):
    """Arms that differ only in their filter start from the same model on the same instances: the
    second copies the first's validation (naming it) instead of repeating it; another seed validates."""
    import torch

    from ragen2.engines.local import trainer

    torch.set_num_threads(1)
    validate, validated = trainer.validate, []

    def spy(run):
        validated.append(run.run_dir.name)
        return validate(run)

    monkeypatch.setattr(trainer, "validate", spy)
    data = {"name": "t", "seeds": [0, 1], "overrides": [*TINY[:-1], "trainer.total_steps=1"], "validate_before": True,
            "matrices": [{"name": "m", "algos": ["grpo"], "filters": ["none", "snr-top-p"], "envs": [None],
                          "models": [str(tiny_model_dir)]}]}
    out = tmp_path / "bench"
    assert main(["bench", write(tmp_path, data), "--out", str(out), "--in-process", "--plain", "--no-plots"]) == 0
    runs = out / "runs"
    # each cell validates after its step; only the first arm of each seed also validates before it
    assert {name: validated.count(name) for name in validated} == {
        "bandit--grpo--none--s0": 2, "bandit--grpo--snr-top-p--s0": 1, "bandit--grpo--none--s1": 2,
        "bandit--grpo--snr-top-p--s1": 1}
    first, copied = (json.loads((runs / f"bandit--grpo--{f}--s0" / "bench_val_before.json").read_text())
                     for f in ("none", "snr-top-p"))
    assert "validated_in" not in first and copied == {**first, "validated_in": "bandit--grpo--none--s0"}
    assert "validated_in" not in json.loads((runs / "bandit--grpo--none--s1" / "bench_val_before.json").read_text())
