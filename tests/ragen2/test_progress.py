"""The live progress line: what it says in each phase, its ETA, and when it stays quiet."""

import io

import envs
import pytest
import torch

from ragen2.progress import LiveLine, RolloutProgress, eta, format_eta
from ragen2.rollout import RolloutConfig, rollout
from tests.tiny import tiny_llama, tiny_tokenizer


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_eta_is_elapsed_over_done_times_remaining():
    assert eta(30.0, 0.25) == pytest.approx(90.0)  # a quarter took 30 s: three quarters take 90 s
    assert eta(10.0, 0.0) is None
    assert format_eta(90) == "1:30" and format_eta(3725) == "1:02:05"


def test_rollout_fraction_counts_the_current_turn_by_its_tokens():
    # turn 2 of 4, 8 episodes started it with 10 tokens each allowed, 40 sampled: 1.5 turns of 4
    p = RolloutProgress(turn=2, max_turns=4, live=5, turn_rows=8, turn_tokens=40, tokens=120,
                        max_new_tokens=10, episodes_done=0, episodes=8)
    assert p.fraction == pytest.approx(1.5 / 4)
    finished = RolloutProgress(turn=2, max_turns=4, live=0, turn_rows=8, turn_tokens=40, tokens=120,
                               max_new_tokens=10, episodes_done=8, episodes=8)
    assert finished.fraction == pytest.approx(2 / 4)


def test_lines_for_rollout_update_and_validation():
    clock = FakeClock()
    line = LiveLine(enabled=False, clock=clock)
    report = line.rollout("rollout")
    clock.now += 20.0  # the prefill: not the pace of the rest
    report(RolloutProgress(2, 4, 6, 8, 0, 160, 10, 0, 8))  # 1/4 done at the first report
    assert line.last_text == "rollout turn 2/4 | 6 live | 8 tok/s | ETA --:--"
    clock.now += 10.0
    report(RolloutProgress(2, 4, 6, 8, 40, 200, 10, 0, 8))  # 1.5/4: an eighth in 10 s, five eighths left
    assert line.last_text == "rollout turn 2/4 | 6 live | 7 tok/s | ETA 0:50"
    micro = line.update()
    clock.now += 10.0
    micro(2, 8)  # a quarter in 10 s
    assert line.last_text == "update micro-batch 2/8 | ETA 0:30"
    val = line.rollout("validation")
    clock.now += 5.0
    val(RolloutProgress(1, 5, 32, 32, 0, 0, 10, 0, 32))
    clock.now += 0.5
    val(RolloutProgress(1, 5, 20, 32, 100, 100, 10, 0, 32))  # replies finish before any episode is over
    assert line.last_text.startswith("validation turn 1/5 | replies 12/32 | episodes over 0/32 | 18 tok/s")


def test_the_first_eta_leaves_out_the_first_prefill():
    # 1 turn of 10 tokens x 8 rows: the prefill takes 60 s, then each token 1 s. From the phase's
    # start, the first ETA would read 60 s / (8/80) x 0.9 = 9 min for a 9 s remainder.
    clock = FakeClock()
    line = LiveLine(enabled=False, clock=clock)
    report = line.rollout("rollout")
    clock.now += 60.0
    report(RolloutProgress(1, 1, 8, 8, 8, 8, 10, 0, 8))
    clock.now += 1.0
    report(RolloutProgress(1, 1, 8, 8, 16, 16, 10, 0, 8))
    assert line.last_text.endswith("ETA 0:08")


def test_quiet_and_not_a_terminal_draw_nothing(monkeypatch):
    assert LiveLine.wanted(quiet=True) is False
    monkeypatch.setattr("sys.stdout", io.StringIO())  # pytest's capture: not a terminal
    assert LiveLine.wanted(quiet=False) is False
    stream = io.StringIO()
    line = LiveLine(enabled=False, stream=stream)
    line.update()(1, 2)
    line.stop()
    assert stream.getvalue() == ""


def test_enabled_line_draws_with_rich_and_clears():
    stream = io.StringIO()
    line = LiveLine(enabled=True, stream=stream)
    line.update()(1, 4)
    line.stop()
    assert "update micro-batch 1/4" in stream.getvalue()


def test_rollout_reports_turns_live_envs_and_tokens():
    tok = tiny_tokenizer("chatml")
    model = tiny_llama(tok, seed=0)
    seen = []
    cfg = RolloutConfig(group_size=2, max_turns=2, max_new_tokens=6)
    batch = rollout(model, tok, lambda: envs.make("sokoban"), [3], cfg, torch.Generator().manual_seed(0),
                    progress=seen.append)
    assert seen and all(1 <= p.turn <= 2 and p.max_turns == 2 and p.episodes == 2 for p in seen)
    assert seen[-1].tokens == batch.num_response_tokens  # the last report has every sampled token
    assert all(b.tokens >= a.tokens for a, b in zip(seen, seen[1:]))  # counts only grow
    assert any(p.live == 2 for p in seen)  # both envs decode together in turn 1
