"""What a person watching a run is told (issue 49, item 6): a step whose groups carry no reward
spread says so on its step line, and the live line gives the whole run's ETA, not only the
current phase's."""

import ragen2
from ragen2 import metric_names as names
from ragen2.progress import LiveLine, RolloutProgress
from ragen2.run_dir import RunLog, read_metrics


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _step_line(tmp_path, capsys, **snr) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = RunLog(tmp_path, 3, {}, quiet=False)
    row = {names.ROLLOUT_REWARD_MEAN: -0.1, names.SNR_GROUPS_TOTAL: 2.0, names.SNR_GROUPS_KEPT: 2.0,
           names.SNR_SKIPPED: 0.0, names.SNR_REWARD_STD_MAX: 0.0, **snr}
    capsys.readouterr()
    log.step(0, row)
    log.close()
    return capsys.readouterr().err


def test_a_step_on_flat_groups_says_it_has_no_learning_signal(tmp_path, capsys):
    line = _step_line(tmp_path, capsys, **{names.SNR_ZERO_SPREAD_GROUPS: 2.0})
    assert "kept 2/2 (0 with spread: no learning signal) |" in line


def test_the_step_line_counts_groups_with_spread_only_when_some_are_flat(tmp_path, capsys):
    some = _step_line(tmp_path / "some", capsys, **{names.SNR_ZERO_SPREAD_GROUPS: 1.0, names.SNR_REWARD_STD_MAX: 0.5})
    assert "kept 2/2 (1 with spread) |" in some and "no learning signal" not in some
    every = _step_line(tmp_path / "every", capsys, **{names.SNR_ZERO_SPREAD_GROUPS: 0.0, names.SNR_REWARD_STD_MAX: 0.5})
    assert "kept 2/2 |" in every and "with spread" not in every


def test_a_refilled_batch_says_how_many_sampling_rounds_it_took(tmp_path, capsys):
    one = _step_line(tmp_path / "one", capsys, **{names.SAMPLING_ROUNDS: 1.0, names.SAMPLING_ROUND_LIMIT: 0.0})
    assert "sampling rounds" not in one
    three = _step_line(tmp_path / "three", capsys, **{names.SAMPLING_ROUNDS: 3.0, names.SAMPLING_ROUND_LIMIT: 0.0})
    assert "kept 2/2 | 3 sampling rounds |" in three and "round limit" not in three
    limit = _step_line(tmp_path / "limit", capsys, **{names.SAMPLING_ROUNDS: 4.0, names.SAMPLING_ROUND_LIMIT: 1.0})
    assert "| 4 sampling rounds (round limit: batch not full) |" in limit


def test_a_skipped_step_and_a_success_signal_with_reward_spread_are_not_called_silent(tmp_path, capsys):
    skipped = _step_line(tmp_path / "skip", capsys, **{names.SNR_ZERO_SPREAD_GROUPS: 2.0, names.SNR_GROUPS_KEPT: 0.0,
                                                       names.SNR_SKIPPED: 1.0})
    assert "kept 0/2 (0 with spread) | SKIPPED" in skipped  # no update ran: SKIPPED says it
    # filter.signal=success: no group's success varies, but format penalties still spread the rewards
    success = _step_line(tmp_path / "success", capsys, **{names.SNR_ZERO_SPREAD_GROUPS: 2.0,
                                                          names.SNR_REWARD_STD_MAX: 0.05})
    assert "kept 2/2 (0 with spread) |" in success and "no learning signal" not in success


def test_a_real_step_on_flat_rewards_prints_it(tmp_path, tiny_model_dir, single_thread, capsys):
    # A random tiny model never closes the answer tag in 4 tokens: every episode scores the same
    # format penalty, the trainer's own row must say so on the printed line.
    cfg = ragen2.load_config(env="sokoban", algo="grpo", overrides=[
        f"model.name={tiny_model_dir}", "trainer.total_steps=1", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.max_turns=1", "rollout.max_new_tokens=4", "trainer.val_groups=1", "trainer.val_before=false",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0"])
    ragen2.train(cfg, run_dir=tmp_path / "run", quiet=False)
    row = read_metrics(tmp_path / "run")[0]
    assert row[names.SNR_ZERO_SPREAD_GROUPS] == 2 and row[names.SNR_REWARD_STD_MAX] == 0
    assert "kept 2/2 (0 with spread: no learning signal)" in capsys.readouterr().err


def _tokens(tokens: int) -> RolloutProgress:
    """One turn of 8 rows x 10 tokens: `tokens` sampled so far is tokens/80 of the phase."""
    return RolloutProgress(1, 1, 8, 8, tokens, tokens, 10, 0, 8)


def test_the_live_line_gives_the_whole_runs_eta():
    clock = FakeClock()
    line = LiveLine(enabled=False, clock=clock, total_steps=3)
    before = line.rollout("validation")  # validation before training: no step has a time yet
    clock.now += 1.0
    before(_tokens(8))
    clock.now += 1.0
    before(_tokens(16))  # a tenth more in 1 s: 8 s of this phase left
    assert line.last_text.endswith("ETA 0:08 | before step 1/3 | run ETA > 0:08")

    clock.now = 100.0
    first = line.rollout("rollout")  # step 1 starts at t=100
    clock.now = 110.0
    first(_tokens(8))
    clock.now = 111.0
    first(_tokens(16))  # 8 s of the rollout left; no step finished: each later one at least 11 + 8 s
    assert line.last_text.endswith("ETA 0:08 | step 1/3 | run ETA > 0:46")
    clock.now = 120.0
    update = line.update()
    clock.now = 130.0
    update(1, 2)  # half in 10 s: 10 s left; 30 s into step 1, so each later step takes 30 + 10 s
    assert line.last_text == "update micro-batch 1/2 | ETA 0:10 | step 1/3 | run ETA > 1:30"

    clock.now = 160.0
    second = line.rollout("rollout")  # step 2 starts: step 1 took 60 s
    clock.now = 170.0
    second(_tokens(8))  # no pace of the phase yet, but the mean step gives the run's: 50 + 60 s
    assert line.last_text.endswith("ETA --:-- | step 2/3 | run ETA 1:50")
    clock.now = 171.0
    second(_tokens(16))
    assert line.last_text.endswith("ETA 0:08 | step 2/3 | run ETA 1:49")
    validation = line.rollout("validation")  # a slow validation at the end of step 2
    clock.now = 201.0
    validation(_tokens(8))
    clock.now = 291.0
    validation(_tokens(16))  # 720 s left in this phase: longer than the mean step's remainder
    assert line.last_text.endswith("ETA 12:00 | step 2/3 | run ETA 13:00")


def test_the_run_eta_counts_from_the_resumed_step_and_is_absent_without_a_plan():
    clock = FakeClock()
    line = LiveLine(enabled=False, clock=clock, total_steps=10, first_step=7)
    line.rollout("rollout")
    update = line.update()
    clock.now += 10.0
    update(1, 2)
    assert line.last_text == "update micro-batch 1/2 | ETA 0:10 | step 8/10 | run ETA > 0:50"  # 10 + 2 x (10 + 10)
    plain = LiveLine(enabled=False, clock=clock)
    plain.rollout("rollout")
    update = plain.update()
    clock.now += 10.0
    update(1, 2)
    assert plain.last_text == "update micro-batch 1/2 | ETA 0:10"


def test_the_trainer_gives_the_live_line_its_plan(tmp_path, tiny_model_dir, single_thread, monkeypatch):
    steps = 2
    seen = []
    original = LiveLine.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(LiveLine, "__init__", spy)
    cfg = ragen2.load_config(env="bandit", algo="grpo", overrides=[
        f"model.name={tiny_model_dir}", f"trainer.total_steps={steps}", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_new_tokens=4", "trainer.val_groups=1", "probe.every=0",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4"])
    ragen2.train(cfg, run_dir=tmp_path / "run")
    (line,) = seen
    assert (line.total_steps, line.first_step) == (steps, 0)
    assert len(line._step_starts) == steps  # each step's rollout started one, validation none
