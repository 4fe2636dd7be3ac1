"""An alert's printed line says why it fired, and on a run too short to judge, that it is short."""

from mi_probe.collapse import Alert

from ragen2.config import ProbeSection
from ragen2.instruments.probe import CollapseWatch, explain_alert


class _Log:
    def __init__(self):
        self.events = []

    def event(self, kind, **fields):
        self.events.append((kind, fields))


def _cliff(watch, log):
    for step, std in enumerate([0.4, 0.4, 0.4, 0.05]):  # baseline 3, then a fall below a quarter of the peak
        watch.observe(step, {"rollout/in_group_reward_std_mean": std}, log)


def test_a_cliff_on_a_six_step_run_says_why_and_that_the_run_is_short():
    log = _Log()
    _cliff(CollapseWatch(ProbeSection(), total_steps=6), log)
    (kind, fields), = [e for e in log.events if e[0] == "alert"]
    message = fields["message"]
    assert message.startswith("reward-std cliff: 0.05 < 0.25 x max reference 0.4")  # the detector's numbers, unchanged
    assert "fewer groups carry a learning signal" in message and "only 6 steps" in message
    assert "\n" not in message


def test_a_long_run_gets_the_reason_without_the_short_run_caveat():
    log = _Log()
    _cliff(CollapseWatch(ProbeSection(), total_steps=500), log)
    (_, fields), = [e for e in log.events if e[0] == "alert"]
    assert "fewer groups carry" in fields["message"] and "only" not in fields["message"]


def test_template_collapse_counts_probes_not_steps():
    alert = Alert("template_collapse", 30, "template collapse: ...", {})
    assert "only 40 steps" in explain_alert(alert, ProbeSection(every=5), 40)  # 6 probes x 5 steps, x3 > 40
    assert "only" not in explain_alert(alert, ProbeSection(every=1), 40)
