"""`ragen2 audit` shows degenerate replies (issue 52 item 3; mi_probe.degeneration): the run report
draws rollout/ and val/degenerate_fraction, lists and colours the degeneration alert and says both
in its verdict; a model audit counts its rollout's degenerate replies and its verdict leads with
them when they are many."""

from __future__ import annotations

import json

import pytest
import torch

import envs
import mi_probe
from mi_probe.degeneration import degenerate_fraction
from ragen2 import metric_names as names
from ragen2.cli import main
from ragen2.reports import audit, audit_report, audit_verdict
from ragen2.reports.audit_verdict import AuditSettings
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save

# --- the run report --------------------------------------------------------------------------

TRAIN_SHARE = [0.0, 0.05, 0.1, 0.5, 0.8, 0.9]  # at or above 0.25 from logged step 3: the alarm fires at 4
VAL_SHARE = {2: 0.0, 5: 0.75}


def _run(tmp_path, config: str = "env: {name: bandit}\nprobe: {every: 1}\n", alert: bool = True):
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for step, share in enumerate(TRAIN_SHARE):
        row = {"step": step, "rollout/success_rate": 0.1, "rollout/in_group_reward_std_mean": 0.3,
               "actor/entropy": 1.0, names.ROLLOUT_DEGENERATE_FRACTION: share}
        if step in VAL_SHARE:
            row[names.VAL_DEGENERATE_FRACTION] = VAL_SHARE[step]
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(config)
    if alert:  # what the training's collapse watch wrote
        event = {"kind": "alert", "alert": "degeneration", "step": 4, "message": "degeneration: 0.8 of the replies "
                 "repeat a character, token or short n-gram (>= 0.25) for 2 steps", "time": 0}
        (run / "events.jsonl").write_text(json.dumps(event) + "\n")
    return run


def test_the_run_report_shows_the_degenerate_share_and_the_alert(tmp_path, monkeypatch, capsys):
    from matplotlib.axes import Axes

    lines = []
    real = Axes.axvline
    monkeypatch.setattr(Axes, "axvline", lambda self, x=0, *a, **k: lines.append((x, k.get("color")))
                        or real(self, x, *a, **k))
    run = _run(tmp_path)
    assert main(["audit", str(run)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((run / "audit" / "summary.json").read_text())
    # the series summary carries both shares
    assert summary["series"][names.ROLLOUT_DEGENERATE_FRACTION] == {
        "n": 6, "first": 0.0, "last": 0.9, "min": 0.0, "max": 0.9, "first_step": 0, "last_step": 5}
    assert summary["series"][names.VAL_DEGENERATE_FRACTION]["max"] == 0.75
    # the logged alert, and the same alert replayed from the series (patience 2: steps 3 and 4)
    assert [(a["kind"], a["step"], a["source"]) for a in summary["alerts"]] == [("degeneration", 4, "logged+replayed")]
    line = ("degenerate replies (" + audit_verdict.DEGENERATE_WHAT + "): training up to 0.90 of a step's replies "
            "(last 0.90), validation up to 0.75 of a step's replies (last 0.75), against the alarm's threshold 0.25; "
            "degeneration alert at step 5")
    assert summary["verdict"]["lines"][1] == line  # right after the key numbers
    assert line in printed and "step 5: degeneration: 0.8 of the replies" in printed
    page = (run / "audit" / "report.html").read_text()
    assert "<td>degeneration</td>" in page and "<li>degenerate replies (" in page
    # series.png: a panel for the shares, the alert marked in its own colour on every panel
    panels = dict(audit_report.series_curves(audit_report.load_run(run).rows))
    curves = panels["degenerate replies (share)"]
    assert [(c.key, c.steps, c.values) for c in curves] == [
        (names.ROLLOUT_DEGENERATE_FRACTION, [1, 2, 3, 4, 5, 6], TRAIN_SHARE),
        (names.VAL_DEGENERATE_FRACTION, [3, 6], [0.0, 0.75])]
    assert audit_report.ALERT_COLOURS["degeneration"] not in {
        colour for kind, colour in audit_report.ALERT_COLOURS.items() if kind != "degeneration"}
    assert set(lines) == {(5, audit_report.ALERT_COLOURS["degeneration"])} and len(lines) == len(panels)


def test_the_runs_own_threshold_decides_and_a_clean_run_says_nothing(tmp_path):
    # degenerate_share 0.95: neither the replayed detector nor the verdict calls 0.9 degenerate
    strict = _run(tmp_path, "env: {name: bandit}\nprobe: {every: 1, collapse: {degenerate_share: 0.95}}\n", alert=False)
    summary = audit_report.summarise(audit_report.load_run(strict))
    assert summary["alerts"] == []
    assert not any("degenerate" in line for line in summary["verdict"]["lines"])
    page = audit_report.render_html(summary, {"series": b""})
    assert "No alert: no template collapse, reward-std cliff, gradient-norm spike or degeneration." in page
    # a lower threshold from the config is the line's too
    summary["config"]["probe"]["collapse"]["degenerate_share"] = 0.5
    assert audit_verdict.degeneration_line(summary).endswith("against the alarm's threshold 0.50")
    # a run that predates the metric: no line, no panel
    old = {"series": {}, "alerts": [], "config": {}}
    assert audit_verdict.degeneration_line(old) is None
    titles = [title for title, _ in audit_report.logged_panels([{"step": 0, names.ROLLOUT_SUCCESS_RATE: 0.5}])]
    assert titles == ["success rate"]


# --- the model verdict ---------------------------------------------------------------------------

BASE = {"num_rows": 32, "num_distinct_prompts": 8, "retrieval_chance_level@1": 0.125, "retrieval_accuracy@1": 0.125,
        "mi_estimate": 0.01, "mi_zscore": 0.1, "policy_entropy": 0.1, "format_ok_fraction": 0.8}


def test_model_verdict_leads_with_degenerate_replies_at_or_above_the_threshold():
    assert audit_verdict.DEGENERATE_HIGH == mi_probe.CollapseDetectorConfig().degenerate_share  # one threshold
    plain = audit_verdict.probe_verdict(BASE)
    assert plain[0] == "low diversity"
    many = {**BASE, "degenerate_fraction": 0.75, "num_replies": 32, "degenerate_replies": 24,
            "degenerate_example": "!!!!!!!!"}
    label, why = audit.verdict(many)
    assert label == plain[0]  # the probe's label stands; the explanation says what it scored
    assert why == (f"degenerate replies: 24 of 32 replies (0.75, at or above 0.25) are {audit_verdict.DEGENERATE_WHAT} "
                   f"(e.g. '!!!!!!!!'); the policy has degenerated (RAGEN #52). {plain[1]}")
    assert audit.verdict({**many, "degenerate_fraction": 0.25, "degenerate_replies": 8})[1].startswith(
        "degenerate replies: 8 of 32 replies (0.25,")  # the threshold itself counts
    for below in (0.2, float("nan")):
        assert audit.verdict({**many, "degenerate_fraction": below}) == plain
    assert audit.verdict(BASE) == plain  # numbers without the count (older JSON)
    line = audit.compare_with_base(many, {**BASE, "degenerate_fraction": 0.0})
    assert "degenerate 0.00 -> 0.75 (+0.75)" in line


# --- the model audit -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def _exclaiming(tok):
    """A tiny model whose every sampled token is "!" (RAGEN #52): its head's logit for "!" is
    raised far above the rest, so sampling at temperature 1 never picks another token."""
    policy = tiny_llama(tok, seed=0)
    bang = tok.convert_tokens_to_ids("!")
    assert tok.decode([bang]) == "!"
    bias = torch.zeros(len(tok))
    bias[bang] = 100.0
    policy.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    return policy


SETTINGS = AuditSettings(groups=4, group_size=2, max_new_tokens=16, num_samples=8, segment="reply")


def test_a_model_audit_of_degenerate_replies_reports_the_share_and_the_verdict_says_so(tok):
    factory = lambda: envs.make("bandit")  # noqa: E731
    numbers = audit.audit_model(_exclaiming(tok), tok, factory, SETTINGS)
    assert numbers["num_replies"] == 8 and numbers["degenerate_replies"] == 8 and numbers["degenerate_fraction"] == 1.0
    assert numbers["degenerate_example"].endswith("!" * 16)
    label, why = audit.verdict(numbers)
    assert why.startswith("degenerate replies: 8 of 8 replies (1.00, at or above 0.25)")
    assert label == audit_verdict.probe_verdict(numbers)[0]
    # a random tiny model's replies: the same count, with mi_probe.degeneration's function
    normal = audit.audit_model(tiny_llama(tok, seed=0), tok, factory, SETTINGS)
    assert normal["num_replies"] == 8 and normal["degenerate_fraction"] < audit_verdict.DEGENERATE_HIGH
    assert "degenerate" not in audit.verdict(normal)[1]


def test_the_degenerate_count_is_the_rollouts_metric(tok):
    from ragen2.rollout import RolloutConfig, rollout

    config = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=16, temperature=1.0)
    batch = rollout(_exclaiming(tok), tok, lambda: envs.make("bandit"), [0, 1], config,
                    torch.Generator().manual_seed(0))
    counted = audit.degeneration(batch)
    replies = [pair for t in batch.trajectories for pair in zip(t.response_texts, t.finish_reasons)]
    assert counted["degenerate_fraction"] == degenerate_fraction(replies) == 1.0
    assert counted["degenerate_fraction"] == batch.metrics()[names.ROLLOUT_DEGENERATE_FRACTION]
    assert all(reason == "length" for _, reason in replies)  # the loop ran to the token budget
