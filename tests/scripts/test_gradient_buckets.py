"""scripts/gradient_buckets.py on a tiny model: RAGEN-2's six reward-variance buckets under both
advantages on one analysis batch, zero-variance groups at zero task gradient, checkpoints loaded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from envs.base import ActionOutcome
from ragen2.config import load_config
from ragen2.run_dir import write_config
from tests.one_pull import OnePullEnv, registered
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
ENV_NAME = "gradient_buckets_half_coin"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gradient_buckets.py"


class HalfCoinEnv(OnePullEnv):
    """One pull. Half the instances pay 0 to every member (zero-variance groups); the other half a
    uniform draw per episode (spread), whatever the text says."""

    def _reset(self, rng: np.random.Generator) -> dict:
        self.flat = bool(rng.random() < 0.5)
        return {}

    def _apply_action(self, action: str) -> ActionOutcome:
        reward = 0.0 if self.flat else float(self.dynamics_rng.uniform(0.0, 1.0))
        return ActionOutcome(reward=reward, terminated=True, success=reward > 0.5)


@pytest.fixture(scope="module")
def half_coin():
    with registered((ENV_NAME, HalfCoinEnv)):
        yield ENV_NAME


def saved_model(folder: Path, seed: int) -> Path:
    """A tiny model and its tokenizer saved as a model folder (a run's start or a later checkpoint)."""
    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def analysis_run(folder: Path, env: str, model: Path, *overrides: str) -> Path:
    """A run directory whose config.yaml the script reads: Dr.GRPO on `env` from `model`."""
    folder.mkdir()
    write_config(folder, load_config(algo="ragen2-dr-grpo", overrides=[
        f"env.name={env}", f"model.name={model}", "model.dtype=float32", "rollout.max_new_tokens=4", *overrides]))
    return folder


def load_tool(name: str):
    """The script as a fresh module (its own globals, so a test may wrap its functions)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_six_buckets_both_advantages_and_zero_variance_groups_at_zero(tmp_path, half_coin):
    start = saved_model(tmp_path / "start", seed=0)
    later = saved_model(tmp_path / "later", seed=1)  # stands for a trained checkpoint: other weights
    run = analysis_run(tmp_path / "run", half_coin, start, "optim.micro_batch_size=8")
    tool = load_tool("gradient_buckets_under_test")
    out = tmp_path / "buckets.json"
    assert tool.main(["--run", str(run), "--checkpoint", "0=start", "--checkpoint", f"5={later}",
                      "--groups", "12", "--group-size", "4", "--out", str(out)]) == 0
    checkpoints = json.loads(out.read_text())["checkpoints"]
    assert tool.ROLLOUT_EPISODES // 4 < 12  # the batch was rolled out in chunks and put together
    assert out.with_suffix(".png").stat().st_size > 10_000  # RAGEN-2's figure, beside the JSON
    assert [(c["step"], c["advantage"]) for c in checkpoints] == [(0, "dr_grpo"), (0, "grpo"), (5, "dr_grpo"),
                                                                  (5, "grpo")]
    for c in checkpoints:
        buckets = c["buckets"]
        assert len(buckets) == 6 and sum(b["groups"] for b in buckets) == 12
        variances = [b["mean_variance"] for b in buckets]
        assert variances == sorted(variances)  # bucket_1 lowest spread
        rising = [b["task_norm"] for b in buckets if b["mean_variance"] > 0]
        assert c["task_norm_nondecreasing"] == (rising == sorted(rising))
        assert 0 < c["zero_variance_groups"] < 12
        # the bound with Var = 0: a flat group's task gradient is zero to rounding, under the floor
        assert c["floor"] > 0 and c["zero_variance_task_norm_max"] <= c["floor"]
        # identical rewards mean-centre to exactly 0.0 here: no pass needed, the norm is exactly 0
        assert c["zero_variance_groups_exactly_zero"] == c["zero_variance_groups"]
        assert c["zero_variance_task_norm_max"] == 0.0
        for b in buckets:
            assert (b["task_norm"] > c["floor"]) == (b["mean_variance"] > 0)
            assert b["entropy_norm"] == pytest.approx(c["entropy_coef"] * b["entropy_norm_unscaled"])
            assert b["entropy_norm"] > 0
    # the same rollouts under both advantages: spreads agree, task norms do not (GRPO divides by the std)
    dr, gr = checkpoints[0]["buckets"], checkpoints[1]["buckets"]
    assert [b["mean_variance"] for b in dr] == [b["mean_variance"] for b in gr]
    assert [b["task_norm"] for b in dr if b["mean_variance"] > 0] != pytest.approx(
        [b["task_norm"] for b in gr if b["mean_variance"] > 0])
    # the reference is the start model: no KL gradient there, one at the later checkpoint
    assert all(b["kl_norm"] <= 1e-4 * b["entropy_norm"] for b in dr)
    assert all(b["kl_norm"] > 1e-4 * b["entropy_norm"] for b in checkpoints[2]["buckets"])


def test_start_listed_after_a_checkpoint_is_still_the_start_model(tmp_path, half_coin):
    """`--checkpoint 5=X --checkpoint 0=start` once analysed X's weights as step 0 (the policy kept
    the last loaded weights): step 0 must equal an analysis of the start alone."""
    start = saved_model(tmp_path / "start", seed=0)
    later = saved_model(tmp_path / "later", seed=1)
    run = analysis_run(tmp_path / "run", half_coin, start, "optim.micro_batch_size=8")
    tool = load_tool("gradient_buckets_start_after_checkpoint")
    common = ["--run", str(run), "--groups", "12", "--group-size", "4"]
    both, alone = tmp_path / "both.json", tmp_path / "alone.json"
    assert tool.main([*common, "--out", str(both), "--checkpoint", f"5={later}", "--checkpoint", "0=start"]) == 0
    assert tool.main([*common, "--out", str(alone), "--checkpoint", "0=start"]) == 0

    def step(path, number):
        return [(c["buckets"], c["group_points"]) for c in json.loads(path.read_text())["checkpoints"]
                if c["step"] == number]
    assert step(both, 0) == step(alone, 0)
    assert step(both, 0) != step(both, 5)  # other weights, other norms: the test can tell them apart


def test_the_preregistered_fit_reads_one_output_per_seed(tmp_path, half_coin):
    model = saved_model(tmp_path / "model", seed=0)
    tool = load_tool("gradient_buckets_fit_under_test")
    outputs = []
    for seed in (0, 1):  # two runs (seeds), two checkpoints each: the per-(seed, checkpoint) effects
        run = analysis_run(tmp_path / f"run{seed}", half_coin, model, "optim.micro_batch_size=8", f"trainer.seed={seed}")
        outputs.append(tmp_path / f"s{seed}.json")
        assert tool.main(["--run", str(run), "--checkpoint", "0=start", "--checkpoint", f"1={model}", "--seed",
                          str(seed), "--groups", "12", "--group-size", "4", "--out", str(outputs[-1])]) == 0
    result = tool.fit(outputs)
    assert set(result) == {"dr_grpo", "grpo"}
    dr = result["dr_grpo"]
    assert set(dr["per_seed_slope"]) == {"0", "1"} and dr["seeds"] == 2
    # rewards uniform on [0, 1]: Dr.GRPO's advantages, so the task norm, grow with the group's std
    assert all(slope > 0 for slope in dr["per_seed_slope"].values())
    assert 0.0 <= dr["p_one_sided_sign"] <= 1.0 and dr["positive"] == 2
    written = tmp_path / "fit.json"  # the file docs read, with the command that wrote it
    assert tool.main(["--fit", *map(str, outputs), "--out", str(written)]) == 0
    on_file = json.loads(written.read_text())
    assert on_file["fit"] == json.loads(json.dumps(result)) and on_file["command"].endswith(f"--out {written}")
    with pytest.raises(SystemExit, match="not found"):
        tool.main(["--fit", str(tmp_path / "no-such-seed.json")])


def test_an_interrupted_analysis_goes_on_from_its_last_checkpoint(tmp_path, half_coin):
    """A checkpoint costs hours on a CPU: the output is written after each one, and a rerun with
    the same run, seeds and batch shape analyses only the checkpoints it lacks."""
    model = saved_model(tmp_path / "model", seed=0)
    run = analysis_run(tmp_path / "run", half_coin, model)
    tool = load_tool("gradient_buckets_resume_under_test")
    analysed, analyse = [], tool.analyse
    tool.analyse = lambda models, cfg, batch, step, *work: analysed.append(step) or analyse(models, cfg, batch, step, *work)
    out = tmp_path / "buckets.json"
    common = ["--run", str(run), "--groups", "8", "--group-size", "4", "--out", str(out)]
    assert tool.main([*common, "--checkpoint", "0=start"]) == 0
    first = json.loads(out.read_text())["checkpoints"]
    assert tool.main([*common, "--checkpoint", "0=start", "--checkpoint", f"3={model}"]) == 0
    assert analysed == [0, 3]
    both = json.loads(out.read_text())["checkpoints"]
    assert both[:2] == first and [c["step"] for c in both] == [0, 0, 3, 3]
    assert tool.main([*common[:-2], "--out", str(out), "--seed", "1", "--checkpoint", "0=start"]) == 0
    assert analysed == [0, 3, 0]  # other analysis seeds: other instances, nothing reused


def test_a_group_at_a_time_with_scaled_grpo_equals_each_advantages_own_decomposition(tmp_path, half_coin):
    """The script takes each group's gradients once and gets GRPO's task term by scaling the
    group's Dr.GRPO one (group_scales); the engine's decomposition, run once per advantage type
    over whole buckets, must give the same bucket norms (to float rounding)."""
    import dataclasses

    import torch

    from ragen2.algos.estimators import compute_advantages
    from ragen2.engines.local import grad_decomp, learner
    from ragen2.engines.local.run import env_factory
    from ragen2.rollout import rollout_in_chunks
    from ragen2.seeding import instance_seeds

    start = saved_model(tmp_path / "start", seed=0)
    later = saved_model(tmp_path / "later", seed=1)
    run = analysis_run(tmp_path / "run", half_coin, start)
    tool = load_tool("gradient_buckets_exact_under_test")
    cfg = tool.analysis_config(run, 12, 4, 0.01, [])
    torch.manual_seed(0)
    models = learner.build_models(cfg)
    tool.load_weights(models, str(later))  # away from the reference: a KL gradient exists
    models.policy.eval()
    batch = rollout_in_chunks(models.policy, models.tokenizer, env_factory(cfg), instance_seeds([0, 1], 12),
                              cfg.rollout, torch.Generator().manual_seed(0), chunk_groups=3)
    out = {c["advantage"]: c for c in tool.analyse(models, cfg, batch, 0)}
    base = learner.update_inputs(models, batch, cfg, old_log_probs=False)
    for advantage in tool.ADVANTAGES:
        algo = cfg.algo.model_copy(update={"advantage": advantage})
        data = dataclasses.replace(base, advantages=compute_advantages(algo, batch, None, None, base.ref_log_probs)[0])
        whole = grad_decomp.decompose(models.policy, cfg, batch, data, prefix="g",
                                      analysis=grad_decomp.Analysis(whole=False))
        buckets = out[advantage]["buckets"]
        assert len(buckets) == 6
        for b in buckets:
            key = f"g/{b['bucket']}/"
            assert b["task_norm"] == pytest.approx(whole[key + "task_norm"], rel=1e-4, abs=1e-9)
            assert b["entropy_norm"] == pytest.approx(whole[key + "entropy_scaled_norm"], rel=1e-4)
            assert b["kl_norm"] == pytest.approx(whole[key + "kl_scaled_norm"], rel=1e-4)
            assert b["tokens"] == whole[key + "num_tokens"]
        assert any(b["kl_norm"] > 0 for b in buckets) and any(b["task_norm"] > 0 for b in buckets)
        # each group's own norm: zero-variance groups exactly 0, the others not
        points = out[advantage]["group_points"]
        assert len(points) == 12
        assert all((p["task_norm"] == 0.0) == (p["reward_std"] == 0) for p in points)


def test_a_training_checkpoints_policy_folder_loads_without_a_model_config(tmp_path):
    """A suite cell's checkpoint holds the policy's weights only (ragen2.models.save_model, no
    config.json): the script loads them with the run's own loader into the model it built."""
    import torch

    from ragen2 import models as model_lib
    from ragen2.run_dir import POLICY_DIR

    tokenizer = tiny_tokenizer("chatml")
    trained, start = tiny_llama(tokenizer, seed=1), tiny_llama(tokenizer, seed=0)
    checkpoint = tmp_path / "step_000005"
    model_lib.save_model(trained, checkpoint / POLICY_DIR)
    assert not (checkpoint / POLICY_DIR / "config.json").exists()
    tool = load_tool("gradient_buckets_load_under_test")
    models = type("Models", (), {"policy": start})()
    tool.load_weights(models, str(checkpoint))
    for name, value in trained.state_dict().items():
        assert torch.equal(start.state_dict()[name], value), name


def test_two_processes_analysing_other_checkpoints_of_one_run_share_one_file(tmp_path, half_coin):
    """A checkpoint costs a core for hours: two processes may analyse two checkpoints of one run
    into one file, and neither's write loses the other's checkpoints."""
    model = saved_model(tmp_path / "model", seed=0)
    run = analysis_run(tmp_path / "run", half_coin, model)
    tool = load_tool("gradient_buckets_shared_file_under_test")
    common = ["--run", str(run), "--groups", "8", "--group-size", "4"]
    other = tmp_path / "other.json"  # what the other process writes when it finishes step 0
    assert tool.main([*common, "--out", str(other), "--checkpoint", "0=start"]) == 0
    out = tmp_path / "buckets.json"
    analyse = tool.analyse

    def other_process_finishes_meanwhile(models, cfg, batch, step, *work):
        done = analyse(models, cfg, batch, step, *work)
        out.write_text(other.read_text())
        return done

    tool.analyse = other_process_finishes_meanwhile
    assert tool.main([*common, "--out", str(out), "--checkpoint", f"3={model}"]) == 0
    merged = json.loads(out.read_text())["checkpoints"]
    assert [(c["step"], c["advantage"]) for c in merged] == [(0, "dr_grpo"), (0, "grpo"), (3, "dr_grpo"), (3, "grpo")]
    assert merged[:2] == json.loads(other.read_text())["checkpoints"]
    assert ["0=start" in c["command"] for c in merged] == [True, True, False, False]  # each names its own command
    assert not list(tmp_path.glob("*.partial"))

    # A process that read step 0 at its start keeps the file's step 0 as the file has it when it
    # writes (here amended meanwhile), not its own stale copy: it owns only what it analysed.
    def file_amended_meanwhile(models, cfg, batch, step, *work):
        done = analyse(models, cfg, batch, step, *work)
        amended = json.loads(out.read_text())
        for c in amended["checkpoints"]:
            c["amended"] = True
        out.write_text(json.dumps(amended))
        return done

    tool.analyse = file_amended_meanwhile
    assert tool.main([*common, "--out", str(out), "--checkpoint", "0=start", "--checkpoint", f"7={model}"]) == 0
    merged = json.loads(out.read_text())["checkpoints"]
    assert [(c["step"], c.get("amended", False)) for c in merged] == [(0, True), (0, True), (3, True), (3, True),
                                                                     (7, False), (7, False)]


def test_the_figure_is_redrawn_from_a_written_file(tmp_path):
    """--plot FILE.json draws FILE.png from the file alone (no run, no model), a bucket of exact zeros included."""
    buckets = [{"mean_variance": v, "task_norm": t, "entropy_norm": 1e-3, "kl_norm": 1e-5}
               for v, t in ((0.0, 0.0), (0.05, 0.02), (0.2, 0.1))]
    result = {"checkpoints": [{"step": s, "advantage": a, "buckets": buckets}
                              for s in (0, 5) for a in ("dr_grpo", "grpo")]}
    written = tmp_path / "buckets.json"
    written.write_text(json.dumps(result))
    assert load_tool("gradient_buckets_plot_under_test").main(["--plot", str(written)]) == 0
    assert (tmp_path / "buckets.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Stop(Exception):
    """Stands for a session's end mid-checkpoint."""


def test_a_checkpoint_stopped_mid_way_goes_on_from_its_last_finished_bucket(tmp_path, half_coin):
    """A checkpoint is about 100 min on one core: a stop in its fourth bucket keeps the rollouts and
    three buckets, the rerun computes only the other three on the same rollouts, and the result is
    the uninterrupted one's."""
    model = saved_model(tmp_path / "model", seed=0)
    run = analysis_run(tmp_path / "run", half_coin, model)
    common = ["--run", str(run), "--groups", "12", "--group-size", "4", "--checkpoint", "0=start"]
    reference = tmp_path / "reference.json"
    assert load_tool("gradient_buckets_whole").main([*common, "--out", str(reference),
                                                     "--work", str(tmp_path / "other-work")]) == 0

    stopped = load_tool("gradient_buckets_stopped")
    computed, compute = [], stopped.bucket_gradient_sums

    def stop_in_the_fourth(models, cfg, data, members, *rest):
        if len(computed) == 3:
            raise Stop
        computed.append(members)
        return compute(models, cfg, data, members, *rest)

    stopped.bucket_gradient_sums = stop_in_the_fourth
    out = tmp_path / "buckets.json"
    with pytest.raises(Stop):
        stopped.main([*common, "--out", str(out)])
    assert not out.exists()
    work = next((run / "gradient-buckets-work").iterdir())
    assert (work / "batch.pt").is_file() and len(json.loads((work / "state.json").read_text())["buckets"]) == 3

    resumed = load_tool("gradient_buckets_resumed")
    again, compute_again = [], resumed.bucket_gradient_sums
    resumed.bucket_gradient_sums = lambda models, cfg, data, members, *rest: (
        again.append(members) or compute_again(models, cfg, data, members, *rest))
    resumed.rollout_in_chunks = lambda *args, **kwargs: pytest.fail("the kept rollouts were rolled out again")
    assert resumed.main([*common, "--out", str(out)]) == 0
    assert len(again) == 3 and not set(map(tuple, again)) & set(map(tuple, computed))
    assert not work.exists()  # the checkpoint is in the output: its work is removed

    def result(path):
        kept_apart = ("wall_s", "rollout_s", "attempts", "command", "code")
        return [{k: v for k, v in c.items() if k not in kept_apart} for c in json.loads(path.read_text())["checkpoints"]]

    assert result(out) == result(reference)
    assert [c["attempts"] for c in json.loads(out.read_text())["checkpoints"]] == [2, 2]
