"""Why a run stops: the ordered stoppers (engines/local/stoppers) and the one decision a run reports."""

import json
from types import SimpleNamespace

import mi_probe
import snr
from ragen2.engines.local.run import StepResult
from ragen2.engines.local.stoppers import first_stop

FILTER_STOP = snr.StopDecision(True, "consecutive_skips", "stopping: skipped")
LOW_VALIDATION = snr.StopDecision(True, "low_validation_success", "stopping: low validation")
COLLAPSE = mi_probe.Alert("template_collapse", 0, "template collapse: test", {})


def _run(signal_name=None):
    interrupts = SimpleNamespace(requested=signal_name is not None, signal_name=signal_name or "")
    return SimpleNamespace(services=SimpleNamespace(interrupts=interrupts))


def test_the_first_decision_wins_interrupts_first_validation_last():
    every = StepResult({}, filter_decision=FILTER_STOP, collapse_alert=COLLAPSE, validation_decision=LOW_VALIDATION)
    stop = first_stop(_run("SIGINT"), every)
    assert (stop.reason, stop.signal, stop.interrupted) == ("interrupted", "SIGINT", True)
    stop = first_stop(_run(), every)
    assert (stop.reason, stop.message, stop.interrupted) == ("consecutive_skips", "stopping: skipped", False)
    stop = first_stop(_run(), StepResult({}, collapse_alert=COLLAPSE, validation_decision=LOW_VALIDATION))
    assert (stop.reason, stop.message) == ("template_collapse", "stopping the run: template collapse: test")
    assert first_stop(_run(), StepResult({}, validation_decision=LOW_VALIDATION)).reason == "low_validation_success"
    assert first_stop(_run(), StepResult({}, validation_decision=snr.StopDecision(False))) is None
    assert first_stop(_run(), StepResult({})) is None


def test_a_step_two_stoppers_decide_on_reports_one_stop(tiny_model_dir, tmp_path, monkeypatch):
    """The filter's skip rule and a collapse alert on the same step: one `stop` event, the row's
    and the summary's stop_reason all name the first decision (the watch used to log its own)."""
    from ragen2.config import load_config
    from ragen2.engines.local import trainer

    # A random tiny model never writes the format: zero spread, snr-top-p keeps nothing, one skip stops.
    cfg = load_config(filter="snr-top-p", overrides=[
        f"model.name={tiny_model_dir}", "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
        "trainer.total_steps=3", "trainer.val_groups=1", "probe.every=0", "probe.stop_on_collapse=true",
        "stop.max_consecutive_skips=1", "optim.micro_batch_size=2", "trainer.num_threads=1"])
    run = trainer.setup(cfg, tmp_path / "run", quiet=True)
    monkeypatch.setattr(run.state.watch.detector, "update", lambda step, **_: [COLLAPSE])
    summary = trainer.train(run)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e.get("reason")) for e in events if e["kind"] in ("stop", "alert")] == [
        ("alert", None), ("stop", "consecutive_skips")]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["stop_reason"] == "consecutive_skips" and rows[0]["alert/template_collapse"]
    assert summary["stop_reason"] == "consecutive_skips" and "val/success_rate" in rows[0]  # it validated its end
