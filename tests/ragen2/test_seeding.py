"""The seed streams: every number below was computed before the streams moved into ragen2.seeding
(from the trainer, `ragen2 eval`, `ragen2 audit` and the probe), so runs repeat across versions."""

from ragen2 import seeding
from ragen2.config import load_config


def test_training_and_validation_instances_are_the_ones_runs_always_met():
    cfg = load_config(overrides=["trainer.seed=7", "rollout.num_groups=3", "trainer.val_groups=4"])
    assert [seeding.step_seeds(cfg, k) for k in (0, 1, 5)] == [
        [2029167940, 1342382291, 1469265225], [1868869221, 1653865097, 1880887029],
        [1199949626, 40807559, 2134822916]]
    assert seeding.validation_seeds(cfg) == [1291927317, 111953225, 464049871, 986811648]
    assert seeding.validation_sampling_seed(cfg) == 987654328
    base = load_config()  # seed 0, 4 groups, 8 validation groups
    assert seeding.step_seeds(base, 0) == [1826701614, 1367864806, 1097657231, 579362555]
    assert seeding.validation_seeds(base) == [55779277, 1530856591, 887603354, 1591146683, 1120870909,
                                              113229157, 1324341065, 1730200533]


def test_eval_audit_and_probe_streams():
    assert seeding.eval_seeds(4, 3) == [769639887, 992675513, 568315675]
    assert seeding.eval_sampling_seed(4) == 555000115
    assert seeding.audit_seeds(0, 3) == [662076733, 2000183325, 1365761374]
    rng = seeding.probe_rng(3)
    assert rng.permutation(6).tolist() == [5, 2, 1, 4, 3, 0] and rng.random() == 0.25799613753973705
    streams = [seeding.VALIDATION_STREAM, seeding.EVAL_STREAM, seeding.AUDIT_STREAM, seeding.PROBE_STREAM]
    assert streams == [987_654_321, 555_000_111, 424_242, 0x9B0BE]


def test_the_openrlhf_datasets_and_eval_do_not_load_the_local_trainer():
    import subprocess
    import sys

    code = "import sys, ragen2.engines.openrlhf.flags, ragen2.commands.eval; print('ragen2.engines.local.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def test_refill_rounds_draw_from_their_own_stream():
    """Dynamic sampling's extra rounds: instances of their own, so round 0 is every arm's step_seeds."""
    cfg = load_config(overrides=["rollout.num_groups=3"])
    rounds = [seeding.refill_seeds(cfg, 2, r) for r in (1, 2)]
    assert rounds[0] != rounds[1] and all(len(seeds) == 3 for seeds in rounds)
    assert rounds[0] == seeding.refill_seeds(cfg, 2, 1)  # a pure function of (seed, step, round)
    drawn = {s for step in range(50) for s in seeding.step_seeds(cfg, step)}
    assert not drawn & set(rounds[0] + rounds[1]) and seeding.refill_seeds(cfg, 3, 1) != rounds[0]
    assert seeding.REFILL_STREAM not in (seeding.VALIDATION_STREAM, seeding.EVAL_STREAM, seeding.AUDIT_STREAM,
                                         seeding.PROBE_STREAM, seeding.DEMO_STREAM)
