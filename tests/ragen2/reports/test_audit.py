"""Collapse diagnostics around training: trajectory-mode probe sampling, the collapse detector's
wiring into the run log and the trainer, and `ragen2 audit` (run report and model verdict)."""

from __future__ import annotations

import json
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from scipy import stats

import mi_probe
from ragen2.reports import audit
from ragen2.cli import main
from ragen2.commands import audit as audit_command
from ragen2.config import ProbeSection
from ragen2.instruments.probe import CollapseWatch, Probe
from tests.tiny import scripted_sokoban_batch, tiny_llama, tiny_tokenizer
from ragen2.run_dir import RunLog

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save
GEN_PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def _cli(argv: list[str]) -> int:
    return main(["audit", *argv])


# --- trajectory-mode sampling ------------------------------------------------------------------


def _hand_batch():
    """Window-mode layout: trajectory 1's turns are rows 1-3. Spans are (row, turn, start, end)."""
    input_ids = torch.arange(4 * 10).reshape(4, 10)
    spans = [(0, 0, 3, 6),  # trajectory 0: one turn
             (1, 0, 2, 4), (2, 1, 5, 8), (3, 2, 4, 9),  # trajectory 1: three turns
             (3, 3, 9, 9)]  # an empty reasoning: not a drawable turn
    return SimpleNamespace(input_ids=input_ids, reasoning_spans=spans, traj_index=torch.tensor([0, 1, 1, 1]))


def test_trajectory_mode_draws_pairs_with_probability_one_over_m_times_one_over_t(tok):
    probe = Probe(ProbeSection(mode="trajectory", num_samples=4), tok)
    batch = _hand_batch()
    counts = Counter()
    for step in range(1500):
        prompts, reasonings, owners = probe.pairs(batch, step)
        assert owners == list(range(len(prompts))) == list(range(len(reasonings)))  # one column per pair
        assert len(prompts) == 4  # min(num_samples, 4 drawable pairs)
        counts.update((p[-1], r[0]) for p, r in zip(prompts, reasonings))
    total = sum(counts.values())
    # a pair is known by (last prompt token, first reasoning token) = (ids[row, start-1], ids[row, start])
    expected = {(2, 3): 1 / 2, (11, 12): 1 / 6, (24, 25): 1 / 6, (33, 34): 1 / 6}
    assert set(counts) == set(expected)
    for pair, p in expected.items():
        assert counts[pair] / total == pytest.approx(p, abs=0.03), pair


def test_trajectory_mode_columns_are_each_pairs_own_context(tok):
    probe = Probe(ProbeSection(mode="trajectory", num_samples=2), tok)
    batch = _hand_batch()
    prompts, reasonings, _ = probe.pairs(batch, step=7)
    assert probe.pairs(batch, step=7) == (prompts, reasonings, [0, 1])  # keyed by the step alone
    by_span = {(tuple(batch.input_ids[r, :s].tolist()), tuple(batch.input_ids[r, s:e].tolist()))
               for r, _, s, e in batch.reasoning_spans if e > s}
    assert {(tuple(p), tuple(z)) for p, z in zip(prompts, reasonings)} <= by_span


def test_trajectory_mode_on_a_real_multi_turn_rollout(tok):
    batch = scripted_sokoban_batch(tok, GEN_PROMPT)
    probe = Probe(ProbeSection(mode="trajectory", num_samples=6), tok)
    prompts, reasonings, _ = probe.pairs(batch, step=0)
    assert {tok.decode(z) for z in reasonings} <= {"go up", "down"}  # turn 2 wrote no reasoning
    assert all(tok.decode(p).endswith("<think>") for p in prompts)
    metrics = probe.measure(tiny_llama(tok), batch, step=0)
    assert metrics["probe/num_rows"] == 6 and metrics["probe/num_prompts"] == 6
    assert math.isfinite(metrics["probe/mi_zscore_ema"])


# --- the collapse detector's wiring ------------------------------------------------------------

MI_SERIES = [2.0, 2.1, 1.9, 1.8, 0.6, 0.5, 0.4, 0.3]  # early level 2.0; below 1.0 from step 4


def test_collapse_watch_logs_an_alert_event_and_stops_when_configured(tmp_path):
    log = RunLog(tmp_path, total_steps=8, config_dict={}, quiet=True)
    watch = CollapseWatch(ProbeSection(stop_on_collapse=True))
    outputs = [watch.observe(step, {"probe/mi_zscore_ema": mi, "actor/entropy": 1.0}, log)
               for step, mi in enumerate(MI_SERIES)]
    log.close()
    assert outputs[:6] == [({}, None)] * 6
    metrics, stopping = outputs[6]
    assert metrics == {"alert/template_collapse": 1.0} and stopping.kind == "template_collapse"
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    # the stop itself is the trainer's decision (engines/local/stoppers), logged there
    assert [(e["kind"], e.get("alert"), e["step"]) for e in events] == [("alert", "template_collapse", 6)]
    assert events[0]["numbers"]["mi_early_level"] == pytest.approx(2.0)
    restored = CollapseWatch(ProbeSection())
    restored.load_state_dict(json.loads(json.dumps(watch.state_dict())))  # survives a JSON checkpoint
    assert restored.detector.state_dict() == watch.detector.state_dict()


def test_collapse_watch_without_stop_only_logs_and_ignores_non_finite_inputs(tmp_path):
    watch = CollapseWatch(ProbeSection())
    out = [watch.observe(step, {"probe/mi_zscore_ema": mi, "actor/entropy": "nan", "actor/grad_norm": 1.0})
           for step, mi in enumerate(MI_SERIES)]
    assert out[6] == ({"alert/template_collapse": 1.0}, None)  # entropy never judged: fires on MI alone
    assert watch.observe(8, {"actor/grad_norm": float("inf")}) == ({"alert/grad_norm_spike": 1.0}, None)


def test_trainer_stops_on_a_collapse_alert_and_checkpoints_the_detector(tok, tmp_path, monkeypatch):
    from ragen2.engines.local import trainer
    from ragen2.config import load_config
    from ragen2.engines.local import learner

    model_dir = tmp_path / "model"
    tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load_config(overrides=[f"model.name={model_dir}", "rollout.num_groups=2", "rollout.group_size=2",
                                 "rollout.max_new_tokens=6", "trainer.total_steps=4", "trainer.val_groups=1",
                                 "probe.every=0", "probe.stop_on_collapse=true", "optim.micro_batch_size=2"])
    run = trainer.setup(cfg, tmp_path / "run", quiet=True, models=learner.build_models(cfg))
    fake = [[], [mi_probe.Alert("template_collapse", 1, "template collapse: test", {"x": 1.0})]]
    monkeypatch.setattr(run.state.watch.detector, "update", lambda step, **_: fake[step] if step < 2 else [])
    summary = trainer.train(run)
    assert summary["steps"] == 2 and summary["stop_reason"] == "template_collapse"
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "alert" and e["alert"] == "template_collapse" and e["step"] == 1 for e in events)
    state = json.loads(next((tmp_path / "run" / "checkpoints").glob("step_*/state.json")).read_text())
    assert "collapse_detector" in state


# --- `ragen2 audit RUN_DIR` --------------------------------------------------------------------

SUCCESS = [0.0, 0.1, 0.1, 0.2, 0.3, 0.3, 0.5, 0.6]
REWARD_STD = [0.4, 0.5, 0.45, 0.5, 0.3, 0.35, 0.3, 0.2]
ENTROPY = [1.2, 1.1, 1.25, 1.0, 1.3, 1.15, 1.2, 1.1]


@pytest.fixture
def fixture_run(tmp_path):
    """A hand-written run: MI-ZScore-EMA falls from step 4, entropy stays; grad metrics at step 5."""
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for step in range(8):
        row = {"step": step, "rollout/success_rate": SUCCESS[step],
               "rollout/in_group_reward_std_mean": REWARD_STD[step],
               "actor/entropy": ENTROPY[step], "probe/mi_zscore_ema": MI_SERIES[step],
               "probe/mi_estimate": MI_SERIES[step] / 10, "probe/retrieval_accuracy@1": 0.9 - 0.1 * step,
               "probe/retrieval_chance_level@1": 0.25, "probe/num_rows": 32.0,
               "rollout/format_ok_fraction": 0.5 + step / 16}
        if step == 5:
            for bucket, std, task in (("bucket_1", 0.0, 0.01), ("bucket_2", 0.5, 0.8), ("all", 0.25, 0.4)):
                row.update({f"grad/{bucket}/reward_std_mean": std, f"grad/{bucket}/task_norm": task,
                            f"grad/{bucket}/entropy_norm": 2.0, f"grad/{bucket}/cos_task_entropy": -0.1})
        rows.append(row)
    rows[3]["probe/mi_estimate"] = "nan"  # the log writes non-finite values as strings
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("env: {name: bandit}\nalgo: {name: grpo}\nprobe: {mode: first_turn, every: 1}\n")
    events = [{"kind": "alert", "alert": "template_collapse", "step": 6, "message": "logged", "time": 0},
              {"kind": "alert", "alert": "grad_norm_spike", "step": 2, "message": "spike", "time": 0},
              {"kind": "checkpoint", "step": 8, "time": 0}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_audit_report_numbers_html_and_json(fixture_run, tmp_path, capsys):
    out = tmp_path / "report"
    assert _cli([str(fixture_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # the console gives the verdict and its key numbers, steps 1-based (logged step 6 = step 7)
    assert "verdict: template collapse" in printed and "2 alert(s)" in printed
    assert "format ok 0.50 -> 0.94" in printed and "8 probe(s) of reasoning segments, at most 32 rows each" in printed
    assert "template-collapse alert at step 7" in printed and "step 3: spike" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"run_dir", "steps", "config", "target", "series", "spearman", "alerts",
                            "grad_decomposition", "bound", "run_stats", "verdict", "validation_before"}
    assert summary["validation_before"] == {}  # the fixture validated nothing before training
    assert summary["run_stats"] == {"probes": 8, "probe_rows_max": 32.0, "skipped_steps": 0}
    table = {entry["key"]: entry for entry in summary["spearman"]}
    want = stats.spearmanr(MI_SERIES, SUCCESS)
    assert table["probe/mi_zscore_ema"]["rho"] == pytest.approx(want.statistic)
    exact = stats.permutation_test((MI_SERIES,), lambda x: stats.spearmanr(x, SUCCESS).statistic,
                                   permutation_type="pairings", n_resamples=math.factorial(8))
    assert table["probe/mi_zscore_ema"]["p_value"] == pytest.approx(exact.pvalue)  # 8 probes: exact
    assert table["actor/entropy"]["rho"] == pytest.approx(stats.spearmanr(ENTROPY, SUCCESS).statistic)
    keep = [s for s in range(8) if s != 3]  # the "nan" row is left out
    assert table["probe/mi_estimate"]["n"] == 7
    assert table["probe/mi_estimate"]["rho"] == pytest.approx(
        stats.spearmanr([MI_SERIES[s] for s in keep], [SUCCESS[s] for s in keep]).statistic)
    assert table["probe/mi_zscore"]["note"] == "not logged" and table["probe/mi_zscore"]["rho"] is None
    alerts = [(a["kind"], a["step"], a["source"]) for a in summary["alerts"]]
    # template collapse: logged, and replayed from the series (early level 2.0, below 1.0 at steps
    # 4, 5, 6, entropy steady); the spike only logged. No reward-std cliff: min 0.2 >= 0.25 x 0.5.
    assert alerts == [("grad_norm_spike", 2, "logged"), ("template_collapse", 6, "logged+replayed")]
    assert summary["grad_decomposition"]["5"]["bucket_2"]["task_norm"] == 0.8
    # a run without *_scaled_norm gets them from its coefficient (grpo here: entropy_coef default 0.001)
    assert summary["grad_decomposition"]["5"]["bucket_2"]["entropy_scaled_norm"] == pytest.approx(0.002)
    assert summary["bound"] == {"num_buckets": 2, "C_max": pytest.approx(1.6),
                                "task_norm_in_zero_std_buckets_max": 0.01}
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3  # proxies, grad bars, bound scatter
    assert "Spearman" in page and "template_collapse" in page and "Verdict: template collapse" in page
    # wide tables scroll inside the page instead of being cut at its width; grad table: 1-based step
    assert page.count("<div class='scroll'><table>") == 3 and "overflow-x:auto" in page
    assert "<p>Step 6:</p>" in page
    for name in ("series", "grad", "bound"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grad_plot_puts_the_scaled_regularisers_beside_the_task_norm(monkeypatch):
    from matplotlib.axes import Axes

    from ragen2.reports import audit_report

    bars = {}
    real_bar = Axes.bar

    def capture(self, xs, heights, width, label=None, **kwargs):
        bars[label] = list(heights)
        return real_bar(self, xs, heights, width, label=label, **kwargs)

    monkeypatch.setattr(Axes, "bar", capture)
    # entropy_coef 0.01: the unscaled norm 3.0 would tower over the task norm 0.5; what the
    # update adds is 0.03. A logged scaled norm is kept, not recomputed.
    grad = {4: {"bucket_1": {"task_norm": 0.5, "entropy_norm": 3.0, "reward_std_mean": 0.1},
                "all": {"task_norm": 0.4, "entropy_norm": 2.0, "entropy_scaled_norm": 0.025, "reward_std_mean": 0.1}}}
    grad = audit_report.with_scaled_norms(grad, {"algo": {"entropy_coef": 0.01, "kl_coef": 0.0}})
    assert grad[4]["bucket_1"]["entropy_scaled_norm"] == pytest.approx(0.03)
    assert grad[4]["all"]["entropy_scaled_norm"] == 0.025
    assert audit_report.plot_grad(grad)[:8] == b"\x89PNG\r\n\x1a\n"
    assert bars["‖g_task‖"] == [0.5, 0.4]
    assert bars["‖entropy_coef · g_entropy‖"] == pytest.approx([0.03, 0.025])
    assert set(bars) == {"‖g_task‖", "‖entropy_coef · g_entropy‖"}  # no KL term logged: no KL bars


def test_audit_of_a_run_without_grad_metrics_and_bad_input(fixture_run, tmp_path, capsys):
    rows = [json.loads(line) for line in (fixture_run / "metrics.jsonl").read_text().splitlines()]
    (fixture_run / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if not k.startswith("grad/")}) + "\n" for r in rows))
    assert _cli([str(fixture_run)]) == 0
    page = (fixture_run / "audit" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and "probe.grad_every" in page
    assert _cli([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert _cli([str(fixture_run), "--model", "bundled"]) == 2
    assert "not both" in capsys.readouterr().err
    assert _cli([]) == 2
    err = capsys.readouterr().err
    assert "give RUN_DIR" in err and "or --model" in err and "not both" not in err


def test_bound_without_spread_says_why_c_is_undefined(fixture_run, tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from ragen2.reports import audit_report

    texts = []
    real_text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: texts.append(s) or real_text(self, x, y, s, *a, **k))
    grad = {0: {"bucket_1": {"task_norm": 0.0, "reward_std_mean": 0.0}, "all": {"task_norm": 0.0,
                                                                              "reward_std_mean": 0.0}}}
    assert audit_report.bound_summary(grad)["C_max"] is None
    assert audit_report.plot_bound(grad)[:8] == b"\x89PNG\r\n\x1a\n"
    assert texts == [audit_report.BOUND_UNDEFINED]


def test_help_of_every_audit_option():
    import argparse

    parser = argparse.ArgumentParser()
    audit_command.add_parser(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["audit"]
    missing = [a.dest for a in sub._actions if a.dest != "help" and not a.help]
    assert missing == []


# --- `ragen2 audit --model` ------------------------------------------------------------------


def test_verdict_rules():
    base = {"num_rows": 32, "num_distinct_prompts": 8, "retrieval_chance_level@1": 0.125, "mi_estimate": 0.3,
            "mi_zscore": 0.5, "policy_entropy": 1.0, "format_ok_fraction": 0.8}
    # z = (acc - 0.125) / sqrt(0.125 * 0.875 / 32) = (acc - 0.125) / 0.05846
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.5})[0] == "input-dependent"  # z = 6.4
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.2})[0] == "weak input dependence"  # z = 1.28
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.125})[0] == "template collapse suspected"
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.125, "policy_entropy": 0.1})[0] == "low diversity"
    assert audit.verdict({"skipped_too_few_groups": 1.0, "num_pairs": 1.0})[0] == "inconclusive"
    # the untrained bundled model as a new user first audits it: 10 rows, format ok 0.031 -> no claim, and what to change
    label, why = audit.verdict({**base, "num_rows": 10, "retrieval_accuracy@1": 0.0, "format_ok_fraction": 0.031})
    assert label == "inconclusive" and "only 10 reasoning segments over 8 prompts" in why and "--groups" in why
    # enough rows but few well-formed turns: no negative claim (collapse) ...
    label, why = audit.verdict({**base, "retrieval_accuracy@1": 0.125, "format_ok_fraction": 0.1})
    assert label == "inconclusive" and "only 0.10 of turns were well-formed" in why
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.2, "format_ok_fraction": float("nan")})[0] == "inconclusive"
    # ... but clear positive evidence stands: it cannot come from prompt-blind reasoning
    assert audit.verdict({**base, "retrieval_accuracy@1": 0.5, "format_ok_fraction": 0.1})[0] == "input-dependent"
    assert audit.verdict({**base, "num_distinct_prompts": 3, "retrieval_accuracy@1": 0.9})[0] == "inconclusive"
    assert audit.retrieval_zscore(0.5, 0.125, 32) == pytest.approx(0.375 / math.sqrt(0.125 * 0.875 / 32))


def test_model_audit_loads_a_checkpoint_on_its_base_and_prints_a_verdict(tok, tmp_path, capsys):
    from ragen2 import models as model_lib

    base = tmp_path / "base"
    tiny_llama(tok, seed=0).save_pretrained(base)
    tok.save_pretrained(base)
    trained = tiny_llama(tok, seed=1)  # "trained" weights: differ from the base
    run = tmp_path / "run"
    model_lib.save_model(trained, run / "checkpoints" / "step_000002" / "policy")
    (run / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    (run / "config.yaml").write_text(f"model: {{name: {base}}}\nenv: {{name: bandit, overrides: {{}}}}\n")
    for spec in (run, run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000002" / "policy"):
        resolved = audit.resolve_model(str(spec))
        assert resolved.source == str(base) and resolved.weights.name == "policy"
    policy, _ = audit.load_model(audit.resolve_model(str(run)))
    for mine, theirs in zip(policy.state_dict().values(), trained.state_dict().values()):
        assert torch.equal(mine, theirs)

    report = tmp_path / "numbers.json"
    code = _cli(["--model", str(run), "--groups", "2", "--group-size", "2", "--max-new-tokens", "4",
                 "--json", str(report)])
    assert code == 0
    out = capsys.readouterr().out
    numbers = json.loads(report.read_text())
    # a random tiny model writes no <think> block: nothing to probe, and the verdict says so
    assert numbers["verdict"] == "inconclusive" and "verdict: inconclusive" in out
    assert numbers["env"] == "bandit" and math.isfinite(numbers["policy_entropy"])
    # the verdict's advice knows the env was in think mode: no "use a think-mode env" to it
    assert (numbers["think_mode"], numbers["max_turns"]) == (True, 1) and "think-mode" not in numbers["explanation"]
    # --segment auto: as a run resolves it, an answer-only env gets the reply segment
    assert _cli(["--model", str(run), "--groups", "2", "--group-size", "2", "--max-new-tokens", "4", "--segment",
                 "auto", "--env-arg", "require_think=false", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["segment"] == "reply"
    assert json.loads(report.read_text())["think_mode"] is False
    assert _cli(["--model", str(tmp_path / "nowhere")]) == 2
    assert _cli(["--model", str(tmp_path)]) == 2  # a folder that is none of the accepted kinds


def test_compare_with_base_lists_the_differences():
    base = {"num_rows": 32, "num_distinct_prompts": 8, "retrieval_accuracy@1": 0.125,
            "retrieval_chance_level@1": 0.125, "mi_estimate": 0.01, "policy_entropy": 1.5, "format_ok_fraction": 0.1,
            "success_rate": 0.25}
    trained = {**base, "retrieval_accuracy@1": 0.5, "mi_estimate": 0.4, "format_ok_fraction": 0.9}
    line = audit.compare_with_base(trained, base)
    assert line.startswith("vs base model (verdict: inconclusive): ")
    assert "retrieval@1 0.125 -> 0.500 (+0.375)" in line and "format ok 0.10 -> 0.90 (+0.80)" in line
    assert "success 0.250 -> 0.250 (+0.000)" in line


# --- the run verdict, from hand-built summaries ---------------------------------------------------


def _summary(steps=6, probes=6, rows=32.0, std_max=0.4, skipped=0, alerts=(), segment=None):
    series = {"rollout/format_ok_fraction": {"n": steps, "first": 0.2, "last": 0.9, "max": 0.9},
              "rollout/in_group_reward_std_mean": {"n": steps, "first": 0.1, "last": 0.3, "max": std_max},
              "rollout/success_rate": {"n": steps, "first": 0.0, "last": 0.5, "max": 0.5},
              "probe/mi_zscore_ema": {"n": probes, "first": 0.3, "last": 1.2, "max": 1.2},
              "probe/retrieval_accuracy@1": {"n": probes, "first": 0.5, "last": 0.75, "max": 0.75},
              "probe/retrieval_chance_level@1": {"n": probes, "first": 0.25, "last": 0.25, "max": 0.25}}
    return {"steps": steps, "series": series, "alerts": list(alerts), "config": {"probe": {"segment": segment}},
            "run_stats": {"probes": probes, "probe_rows_max": rows if probes else None, "skipped_steps": skipped}}


def test_run_verdict_rules():
    label, lines = audit.run_verdict(_summary())
    assert label == "no collapse detected"
    assert lines == ["6 steps; format ok 0.20 -> 0.90; success 0.00 -> 0.50; in-group reward std max 0.400; "
                     "6 probe(s) of reasoning segments, at most 32 rows each",
                     "MI-ZScore-EMA 0.30 -> 1.20, retrieval@1 last 0.75 vs chance 0.25"]
    label, lines = audit.run_verdict(_summary(std_max=0.0))
    assert label == "inconclusive" and lines[1].startswith("no reward spread: every group's rollouts scored the same")
    label, lines = audit.run_verdict(_summary(skipped=6))  # the filter skipped every step
    assert label == "inconclusive" and "6 skipped step(s)" in lines[0] and lines[1].startswith("no reward spread")
    label, lines = audit.run_verdict(_summary(probes=0))
    assert label == "inconclusive" and lines[1].startswith("no reasoning to probe: the probe never ran")
    label, lines = audit.run_verdict(_summary(rows=4.0))
    assert lines[1].startswith("no reasoning to probe: the probe scored at most 4 reasoning segments (needs 16)")
    label, lines = audit.run_verdict(_summary(std_max=0.0, probes=0))  # both said, spread first
    assert [line.split(":")[0] for line in lines[1:3]] == ["no reward spread", "no reasoning to probe"]
    assert lines[-1] == ("No single change would make it conclusive; rerun with all of: rollout.group_size=8 (more "
                         "rollouts per prompt, so that some of a group's differ); probe.every=1.")
    label, lines = audit.run_verdict(_summary(probes=2))
    assert label == "inconclusive" and lines[1].startswith("only 2 probe(s) (a trend needs 3)")
    # the main job's case: 6 steps probed every 5 -> 2 probes; every 2 gives 3
    assert lines[-1] == "One change would make it conclusive: rerun with probe.every=2 (3 probes in 6 steps)."
    label, lines = audit.run_verdict(_summary(rows=4.0))
    assert lines[-1].startswith("One change would make it conclusive: rerun with probe.segment=reply")
    alert = {"kind": "template_collapse", "step": 4, "message": "MI-ZScore-EMA fell"}
    label, lines = audit.run_verdict(_summary(alerts=[alert, {"kind": "grad_norm_spike", "step": 1, "message": ""}]))
    assert label == "template collapse" and lines[1:] == ["template-collapse alert at step 5: MI-ZScore-EMA fell"]
    label, lines = audit.run_verdict(_summary(rows=4.0))  # reasoning: the advice names the reply segment
    assert "or probe whole replies (probe.segment=reply)" in lines[1]


def test_run_verdict_over_replies_names_them_and_asks_for_rollouts_not_the_format():
    label, lines = audit.run_verdict(_summary(segment="reply"))
    assert label == "no collapse detected" and "6 probe(s) of replies, at most 32 rows each" in lines[0]
    label, lines = audit.run_verdict(_summary(segment="reply", rows=8.0))
    assert label == "inconclusive" and lines[1] == (
        "too few replies to probe: the probe scored at most 8 replies (needs 16). Roll out more groups per step "
        "(rollout.num_groups, rollout.group_size) and probe every step")


def test_model_verdict_over_replies_is_not_gated_by_the_format_rate():
    base = {"num_rows": 32, "num_distinct_prompts": 8, "retrieval_chance_level@1": 0.125, "mi_estimate": 0.3,
            "mi_zscore": 0.5, "policy_entropy": 1.0, "format_ok_fraction": 0.1, "retrieval_accuracy@1": 0.125}
    assert audit.verdict(base)[0] == "inconclusive"  # reasoning rows from 10% well-formed turns: a selected sample
    label, why = audit.verdict({**base, "segment": "reply"})  # every reply is a row: the claim can be made
    assert label == "template collapse suspected" and why.startswith("the reply varies but does not identify")
    label, why = audit.verdict({**base, "segment": "reply", "num_rows": 10})
    assert label == "inconclusive" and "only 10 replies over 8 prompts" in why and "too few rollouts" in why


def test_spearman_p_value_is_exact_for_the_few_probes_a_short_run_has():
    # 3 probes in perfect rank order: 2 of the 6 orderings reach |rho| = 1, so p = 1/3 (the t
    # approximation said 0); 4 probes: 2 of 24; a constant side stays undefined
    from ragen2.reports.audit_report import spearman

    assert spearman([(0.1, 1.0), (0.2, 2.0), (0.3, 3.0)]) == (pytest.approx(1.0), pytest.approx(1 / 3))
    assert spearman([(1, 4), (2, 3), (3, 2), (4, 1)]) == (pytest.approx(-1.0), pytest.approx(2 / 24))
    assert spearman([(1, 1), (2, 1), (3, 1)]) is None
    rho, p = spearman([(float(i), float((i * 7) % 11)) for i in range(12)])  # past 8: scipy's t approximation
    assert -1 <= rho <= 1 and 0 < p <= 1
