"""The degeneration detector (issue 52 item 3): constructed degenerate and normal replies, its
linear cost, the rollout metric, and the collapse detector's alarm and stop rule over it."""

import numpy as np
import pytest
import torch

from mi_probe import degeneration
from mi_probe.collapse import CollapseDetector, CollapseDetectorConfig
from mi_probe.degeneration import DegenerationConfig, degenerate_fraction, judge_reply
from ragen2 import metric_names as names
from ragen2.config import ProbeSection
from ragen2.instruments.probe import CollapseWatch, series_values
from ragen2.rollout.batch import RolloutBatch, TrajectoryRecord

PROSE = ("<think>The box is left of the target, so I push it right once and then check whether the "
         "path down is clear before the next move.</think>")

# (reply, finish reason, kind): each a way a policy degenerates
DEGENERATE = [
    ("!!!!!!!!!!!!!!!!!!!!!!!!", "stop", "repeat"),  # RAGEN #52
    ("<answer>" + "!" * 60, "length", "repeat"),
    ("the the the the the the the the the the the the", "stop", "repeat"),  # one token
    ("<think>I think I think I think I think I think I think I think I think</think>", "stop", "repeat"),
    ("<think>" + "Let me check the box again. " * 8, "length", "repeat"),  # a sentence loop
    ("\n" * 40, "length", "repeat"),
    ("<answer> Red 4 Red 4 Red " + "Red " * 26, "length", "repeat"),  # one of the committed completions
    ("ooooooooooooooooooooooooooooooooooooooooooooooo", "stop", "repeat"),
    ("思考思考思考思考思考思考思考思考思考思考", "stop", "repeat"),  # not ASCII
    (PROSE + " Right, Right, Right, Right, Right, Right, Right, Right, Right", "length", "loop_cut"),
]

NORMAL = [
    (PROSE + "<answer>Right</answer>", "stop"),
    ("<answer>Up || Up || Up || Up || Up</answer>", "stop"),  # five identical actions: RAGEN's per-turn budget
    ("<answer> Engineer </answer>", "stop"),
    ("<answer>1000</answer>", "stop"),
    ("!!!", "stop"),  # too short to judge
    ("ok", "length"),
    ("<think>Step 1: move up. Step 2: move left. Step 3: push the box down. Step 4: done.</think>", "stop"),
    ("<answer>\nYes,  StartupFounder is the one who earns the more rewards,  this is based on the order of "
     "the names in blue, meaning first", "length"),  # a committed completion cut at the budget
    (PROSE + " ab ab ab", "length"),  # a short repeat at a cut: under six repeats
    ("| a | b |\n| --- | --- |\n| 1 | 2 |\n| 3 | 4 |", "stop"),
]


@pytest.mark.parametrize("text, reason, kind", DEGENERATE)
def test_constructed_degenerate_replies_are_flagged(text, reason, kind):
    verdict = judge_reply(text, reason)
    assert verdict.degenerate and verdict.kind == kind, verdict


@pytest.mark.parametrize("text, reason", NORMAL)
def test_constructed_normal_replies_are_not(text, reason):
    assert not judge_reply(text, reason).degenerate


def test_a_loop_cut_by_the_budget_is_degenerate_only_when_cut():
    text = PROSE + " and so on" * 7  # covers a third of the reply: a loop only if the budget stopped it
    assert judge_reply(text, "length").kind == "loop_cut"
    assert not judge_reply(text, "stop").degenerate


def test_the_work_is_linear_in_the_reply_length(monkeypatch):
    # one comparison pass per period, each over at most the reply: max_period x n elements in all
    seen = []
    real = degeneration._runs

    def counting(matches):
        seen.append(matches.size)
        return real(matches)

    monkeypatch.setattr(degeneration, "_runs", counting)
    rng = np.random.default_rng(0)
    for n in (1_000, 100_000):
        seen.clear()
        text = "".join(rng.choice(list("abcdefgh "), size=n))
        assert not judge_reply(text, "length").degenerate
        assert len(seen) == 64 and sum(seen) <= 64 * n


def test_degenerate_fraction_and_config_checks():
    replies = [(t, r) for t, r, _ in DEGENERATE[:3]] + NORMAL[:5]
    assert degenerate_fraction(replies) == pytest.approx(3 / 8)
    assert degenerate_fraction([]) == 0.0
    assert judge_reply("abababababababab", config=DegenerationConfig(min_repeats=9)).degenerate is False
    with pytest.raises(ValueError, match="cover must be in"):
        DegenerationConfig(cover=0.0)
    with pytest.raises(ValueError, match="min_repeats must be an int >= 1"):
        DegenerationConfig(min_repeats=0)


def _batch(replies):
    trajectories = [TrajectoryRecord(group=i, member=0, seed=i, turn_rewards=[0.0], response_texts=[text],
                                     format_ok=[True], think_lengths=[0], response_lengths=[1],
                                     finish_reasons=[reason]) for i, (text, reason) in enumerate(replies)]
    empty = torch.zeros(0)
    return RolloutBatch(*(empty,) * 13, trajectories=trajectories, reasoning_spans=[], group_size=1)


def test_the_rollout_logs_the_share_of_degenerate_replies():
    batch = _batch([DEGENERATE[0][:2], NORMAL[0], NORMAL[1], DEGENERATE[4][:2]])
    assert batch.metrics()[names.ROLLOUT_DEGENERATE_FRACTION] == 0.5
    assert batch.metrics(prefix=names.VAL)["val/degenerate_fraction"] == 0.5


def test_the_alarm_fires_after_patience_and_rearms():
    detector = CollapseDetector(CollapseDetectorConfig(degenerate_share=0.25, degenerate_patience=2))
    fired = [[a.kind for a in detector.update(step, degenerate_fraction=v)]
             for step, v in enumerate([0.0, 0.3, 0.1, 0.3, 0.6, 0.9, 0.0, 0.5, 0.5])]
    assert fired == [[], [], [], [], ["degeneration"], [], [], [], ["degeneration"]]
    assert detector.alerts[0].numbers == {"degenerate_fraction": 0.6, "threshold": 0.25, "consecutive_steps": 2.0}
    with pytest.raises(ValueError, match="degenerate_fraction must be >= 0"):
        detector.update(9, degenerate_fraction=-0.1)
    with pytest.raises(ValueError, match="degenerate_share must be a fraction"):
        CollapseDetectorConfig(degenerate_share=0.0)


def test_the_alarm_state_survives_a_checkpoint_and_old_states_load():
    detector = CollapseDetector()
    detector.update(0, degenerate_fraction=0.5)
    resumed = CollapseDetector()
    resumed.load_state_dict(detector.state_dict())
    assert [a.kind for a in resumed.update(1, degenerate_fraction=0.5)] == ["degeneration"]
    old = detector.state_dict()
    del old["degeneration"]  # a checkpoint from before the alarm existed
    CollapseDetector().load_state_dict(old)


class _Log:
    def __init__(self):
        self.events = []

    def event(self, kind, **fields):
        self.events.append((kind, fields))


def test_the_watch_alerts_and_stops_on_an_early_warning():
    assert series_values({names.ROLLOUT_DEGENERATE_FRACTION: 0.4}) == {"degenerate_fraction": 0.4}
    log, watch = _Log(), CollapseWatch(ProbeSection(stop_on_early_warning=True), total_steps=100)
    outcomes = [watch.observe(step, {names.ROLLOUT_DEGENERATE_FRACTION: 0.75}, log) for step in range(2)]
    assert outcomes[0] == ({}, None)
    metrics, stopping = outcomes[1]
    assert metrics == {"alert/degeneration": 1.0} and stopping.kind == "degeneration"
    (kind, fields), = log.events
    assert kind == "alert" and "repeat a character, token or short n-gram" in fields["message"]
    quiet = CollapseWatch(ProbeSection(), total_steps=100)
    outcomes = [quiet.observe(step, {names.ROLLOUT_DEGENERATE_FRACTION: 1.0}) for step in range(2)]
    assert outcomes[1] == ({"alert/degeneration": 1.0}, None)  # alerts; stops only with stop_on_early_warning
