"""The trainer subclass's parts on OpenRLHF's real code: our filter's batch through OpenRLHF's
compute_advantages_and_returns (GRPO / Dr.GRPO / GAE parity at 1e-6), the skip ledger and stop
policy in RagenPPOTrainer.train_step, and the MI probe through OpenRLHF's Actor.forward."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.ragen2.engines.openrlhf import openrlhf_stubs

modules = openrlhf_stubs.load()
em_lib = modules["openrlhf.trainer.ppo_utils.experience_maker"]
Experience = modules["openrlhf.trainer.ppo_utils.experience"].Experience
FixedKLController = modules["openrlhf.trainer.ppo_utils.kl_controller"].FixedKLController
Actor = modules["openrlhf.models.actor"].Actor
trainer_patch = modules["ragen2.engines.openrlhf.trainer_patch"]

import mi_probe  # noqa: E402
import snr  # noqa: E402
from ragen2.algos import dr_grpo_advantages, gae_advantages, grpo_advantages, rewards_at_turn_ends  # noqa: E402
from ragen2.config import ProbeSection, load_config  # noqa: E402
from ragen2.engines.openrlhf.flags import Cluster, trainer_settings  # noqa: E402
from ragen2.engines.openrlhf.probe_scoring import cross_score_with_forward, probe_metrics  # noqa: E402
from ragen2.engines.openrlhf.selection import SampleGroupError, fit_to_unit, select_samples  # noqa: E402
from ragen2.instruments.probe import Probe  # noqa: E402
from tests.tiny import tiny_llama, tiny_tokenizer  # noqa: E402

G = 4
WIDTH = 20
# Six groups: 0 and 4 have no spread; 1 and 3 the most; snr-top-p keeps 1, 3 and 5 here.
REWARDS = [[1.0] * 4, [0.0, 1.0, 0.0, 1.0], [0.0, 0.1, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.3] * 4,
           [0.5, 0.0, 0.2, 0.9]]


def sample(reward: float, label: str, seed: int) -> Experience:
    g = torch.Generator().manual_seed(seed)
    start = int(torch.randint(2, 8, (1,), generator=g))
    end = int(torch.randint(start + 2, WIDTH, (1,), generator=g))
    action = torch.zeros(1, WIDTH - 1, dtype=torch.bool)
    action[0, start:end] = True
    return Experience(sequences=torch.randint(1, 50, (1, WIDTH), generator=g),
                      attention_mask=torch.ones(1, WIDTH, dtype=torch.long), action_mask=action,
                      rewards=torch.tensor([reward]), response_length=torch.tensor([end - start]),
                      total_length=torch.tensor([WIDTH]), truncated=torch.tensor([False]),
                      prompts=[label], labels=[label], info={})


def samples(rewards=REWARDS) -> list:
    return [sample(r, f"group-{g}", 10 * g + j) for g, row in enumerate(rewards) for j, r in enumerate(row)]


def snr_top_p() -> snr.FilterConfig:
    return snr.load_preset("snr-top-p")


def test_the_filter_keeps_whole_groups_in_original_order():
    batch = samples()
    chosen = select_samples(batch, G, snr_top_p(), unit=G)
    expected = snr.select_groups(torch.tensor(REWARDS, dtype=torch.float64), snr_top_p()).kept.tolist()
    assert chosen.kept_groups == expected == [1, 3, 5]
    assert chosen.samples == [batch[g * G + j] for g in expected for j in range(G)]
    assert not chosen.skip and chosen.metrics["snr/groups_trained"] == 3.0


def test_a_kept_count_that_does_not_fill_the_batch_unit_drops_the_lowest_scored_groups():
    batch = samples()
    chosen = select_samples(batch, G, snr_top_p(), unit=2 * G)  # 3 groups kept, 2 fit
    scores = chosen.selection.scores
    lowest = min([1, 3, 5], key=lambda g: (float(scores[g]), -g))
    assert chosen.kept_groups == sorted(set([1, 3, 5]) - {lowest})
    assert chosen.metrics["snr/groups_dropped_for_batch"] == 1.0
    assert fit_to_unit([0, 1, 2], torch.tensor([1.0, 1.0, 1.0]), 2, 4) == [0, 1]  # ties: the later group goes
    nothing = select_samples(batch, G, snr_top_p(), unit=4 * G)
    assert nothing.skip and nothing.reason == "batch_unit" and nothing.samples == []
    flat = select_samples(samples([[1.0] * 4] * 3), G, snr_top_p(), unit=G)
    assert flat.skip and flat.reason == "filter"


def test_groups_must_be_whole_and_contiguous():
    batch = samples()
    with pytest.raises(SampleGroupError, match="whole number of groups"):
        select_samples(batch[:-1], G, snr_top_p(), unit=G)
    swapped = batch[:3] + [batch[4]] + [batch[3]] + batch[5:]
    with pytest.raises(SampleGroupError, match="contiguous"):
        select_samples(swapped, G, snr_top_p(), unit=G)


def experience_maker(estimator: str):
    args = SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
        rollout=SimpleNamespace(n_samples_per_prompt=G, micro_batch_size=3, max_new_tokens=None),
        reward=SimpleNamespace(clip_range=(-1e9, 1e9), overlong_buffer_len=None, stop_properly_penalty_coef=None),
        train=SimpleNamespace(dynamic_batch_enable=False), data=SimpleNamespace(max_len=WIDTH))
    return em_lib.RemoteExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                        SimpleNamespace(pad_token_id=0))


def through_openrlhf(kept: list, estimator: str, values=None) -> list:
    """split_rollout_samples and compute_advantages_and_returns (OpenRLHF's); make_experience's
    model outputs (log-probs, values, KL) are filled in by hand."""
    maker = experience_maker(estimator)
    experiences = maker.split_rollout_samples(kept)
    for exp in experiences:
        exp.action_log_probs = torch.zeros(exp.action_mask.shape)
        exp.kl = torch.zeros(exp.action_mask.shape)
        exp.values = None if values is None else values[exp.index]
    return maker.compute_advantages_and_returns(experiences)


def stacked(experiences, field):
    return torch.cat([getattr(e, field) for e in experiences]).double()


@pytest.mark.parametrize("estimator", ["group_norm", "dr_grpo"])
def test_openrlhf_group_advantages_on_our_filtered_batch_match_ours(estimator):
    kept = select_samples(samples(), G, snr_top_p(), unit=G).samples
    experiences = through_openrlhf(kept, estimator)
    mask = torch.cat([e.action_mask for e in experiences])
    assert torch.equal(torch.tensor([i for e in experiences for i in e.index]), torch.arange(len(kept)))
    token_rewards = rewards_at_turn_ends(mask, torch.tensor([float(s.rewards) for s in kept], dtype=torch.float64))
    group_ids = torch.arange(len(kept)) // G
    if estimator == "group_norm":
        ours = grpo_advantages(token_rewards, mask, group_ids, eps=1e-9)
    else:
        ours = dr_grpo_advantages(token_rewards, mask, group_ids)
    theirs = stacked(experiences, "advantages")
    assert torch.allclose(theirs[mask], ours[mask], atol=1e-6, rtol=0)
    kept_std = torch.tensor([REWARDS[g] for g in (1, 3, 5)]).std(-1).repeat_interleave(G)
    assert torch.allclose(torch.cat([e.info["group_reward_std"] for e in experiences]), kept_std)


def test_openrlhf_gae_on_our_filtered_batch_matches_ours_with_its_whitening():
    kept = select_samples(samples(), G, snr_top_p(), unit=G).samples
    values = torch.randn(len(kept), WIDTH - 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    experiences = through_openrlhf(kept, "gae", values)
    mask = torch.cat([e.action_mask for e in experiences])
    token_rewards = rewards_at_turn_ends(mask, torch.tensor([float(s.rewards) for s in kept], dtype=torch.float64))
    raw, returns = gae_advantages(token_rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    # OpenRLHF whitens over the batch's action tokens with the population variance (ragen2: n - 1).
    picked = raw[mask]
    whitened = (picked - picked.mean()) / picked.var(unbiased=False).clamp(min=1e-8).sqrt()
    assert torch.allclose(stacked(experiences, "advantages")[mask], whitened, atol=1e-6, rtol=0)
    assert torch.allclose(stacked(experiences, "returns")[mask], returns[mask], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- the subclass's train_step


class Generator:
    def __init__(self):
        self.calls = 0

    def generate_samples(self, **kwargs):
        self.calls += 1
        return ["real batch"], None, G, False


@pytest.fixture
def trainer(monkeypatch):
    calls = {"train": [], "logs": [], "eval": []}
    base = trainer_patch._Base
    monkeypatch.setattr(base, "train_step", lambda self, kept, step: (calls["train"].append(kept) or
                                                                      ({"policy_loss": 0.5}, step + 1)))
    monkeypatch.setattr(base, "save_logs_and_checkpoints",
                        lambda self, step, logs=None, states=None: calls["logs"].append((step, dict(logs))))
    monkeypatch.setattr(base, "evaluate", lambda self, step, **kw: calls["eval"].append(step) or {"eval": 1.0})
    cfg = load_config(filter="snr-top-p", overrides=["rollout.group_size=4", "rollout.num_groups=6", "probe.every=0",
                                                     "stop.max_consecutive_skips=2", "optim.micro_batch_size=1",
                                                     "optim.mini_batch_size=4", "trainer.total_steps=3",
                                                     "trainer.val_every=0", "trainer.save_every=0"])
    instance = trainer_patch.RagenPPOTrainer.__new__(trainer_patch.RagenPPOTrainer)
    instance.args = SimpleNamespace(rollout=SimpleNamespace(micro_batch_size=1), ckpt=SimpleNamespace(save_steps=-1),
                                    ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1))
    instance.samples_generator = Generator()
    instance._ragen_setup(trainer_settings(cfg, Cluster(gpus_per_node=4)), tiny_tokenizer("chatml"))
    instance.calls = calls
    return instance


def test_skipped_steps_are_not_logged_and_are_counted_on_the_next_logged_step(trainer):
    flat = samples([[1.0] * 4] * 6)
    status, step = trainer.train_step(flat, 7)
    assert (status, step) == ({}, 7) and trainer.calls["train"] == []
    trainer.save_logs_and_checkpoints(step, status, {})
    assert trainer.evaluate(step) == {} and trainer.calls["logs"] == [] and trainer.calls["eval"] == []

    batch = samples()
    status, step = trainer.train_step(batch, 7)
    assert step == 8 and trainer.calls["train"] == [[batch[g * G + j] for g in (1, 3, 5) for j in range(G)]]
    assert status["ragen2/skipped_steps"] == 1.0 and status["ragen2/skipped_steps_total"] == 1.0
    assert status["policy_loss"] == 0.5 and status["snr/groups_kept"] == 3.0 and status["snr/skipped"] == 0.0
    trainer.save_logs_and_checkpoints(step, status, {})
    assert trainer.calls["logs"][0][0] == 8
    assert trainer.evaluate(step) == {} and trainer.calls["eval"] == []  # step 2 of 3, val_every=0: not due

    status, _ = trainer.train_step(samples(), 8)
    assert status["ragen2/skipped_steps"] == 0.0 and status["ragen2/skipped_steps_total"] == 1.0


def test_the_stop_policy_ends_fit_through_an_exhausted_generator(trainer):
    flat = samples([[1.0] * 4] * 6)
    assert trainer.samples_generator.generate_samples() == (["real batch"], None, G, False)
    trainer.train_step(flat, 0)
    assert trainer.ragen.stop_reason is None
    trainer.train_step(flat, 0)  # the second consecutive skip reaches max_consecutive_skips=2
    assert trainer.ragen.stop_reason == "consecutive_skips"
    assert trainer.samples_generator.generate_samples() == ([], None, 0, True)
    assert trainer.ragen.ledger.held["ragen2/stopped"] == 1.0


# ----------------------------------------------------------------------------- the MI probe


@pytest.fixture(scope="module")
def actor_and_model():
    tok = tiny_tokenizer("chatml")
    model = tiny_llama(tok, seed=3).eval()
    actor = Actor(model)  # OpenRLHF's Actor around an in-process model
    actor.packing_samples = False  # set by the from-pretrained branch only
    return tok, model, actor


def actor_forward(actor):
    def forward(sequences, action_masks, attention_masks):
        with torch.no_grad():
            return [actor(s, a, att) for s, a, att in zip(sequences, action_masks, attention_masks)]
    return forward


def test_cross_scoring_through_openrlhfs_actor_forward_matches_the_reference(actor_and_model):
    tok, model, actor = actor_and_model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (7, 11, 4)]
    reasonings = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (5, 1, 9, 3)]
    widths = []

    def recording_forward(sequences, action_masks, attention_masks):
        widths.extend(tuple(s.shape) for s in sequences)
        return actor_forward(actor)(sequences, action_masks, attention_masks)

    L, L_sum = cross_score_with_forward(recording_forward, prompts, reasonings, pad_id=tok.pad_token_id,
                                        micro_batch_size=5)
    reference = mi_probe.cross_score_naive(model, prompts, reasonings, [0, 1, 2, 0])
    assert torch.allclose(L, reference.L, atol=1e-5) and torch.allclose(L_sum, reference.L_sum, atol=1e-5)
    # The 12 pairs go longest first into micro-batches of 5, each padded to its own longest pair.
    totals = sorted((len(p) + len(z) for p in prompts for z in reasonings), reverse=True)
    assert widths == [(len(totals[s:s + 5]), totals[s]) for s in range(0, len(totals), 5)]


def test_probe_metrics_from_agent_episodes_match_the_local_probe(actor_and_model, monkeypatch):
    from tests.ragen2.engines.openrlhf.test_openrlhf_agent import REPLIES, FakeEngine, label, run

    agent_lib = modules["ragen2.engines.openrlhf.agent"]
    SamplesGenerator = modules["openrlhf.trainer.ppo_utils.samples_generator"].SamplesGenerator
    tok, model, actor = actor_and_model
    episodes = []
    for seed in (3, 4):  # two groups (two instances) of two episodes
        executor = agent_lib.AgentExecutor()
        for _ in range(2):
            out = run(executor, tok, FakeEngine(tok, REPLIES), label(seed=seed, max_turns=2))
            episodes.append(SamplesGenerator._process_response_into_experience(None, out, max_len=4096))
    probe = Probe(ProbeSection(every=1, num_samples=8), tok)
    ours = probe_metrics(probe, episodes, 2, step=0, forward=actor_forward(actor), prefill="<think>")
    reference_probe = Probe(ProbeSection(every=1, num_samples=8), tok)
    from ragen2.engines.openrlhf.probe_scoring import probe_batch

    prompts, reasonings, owners = reference_probe.pairs(probe_batch(episodes, 2, tok, "<think>", probe.pad_id), 0)
    assert len(reasonings) == 4 and sorted(set(owners)) == [0, 1]  # first-turn reasoning of every episode
    scores = mi_probe.cross_score_naive(model, prompts, reasonings, owners)
    expected = mi_probe.mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids)
    for key, value in expected.items():  # float32 scores; the z-scores divide by a small std: rel 1e-4
        assert ours[f"probe/{key}"] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert ours["probe/dtype"] == "bfloat16"  # the engine's actor precision (--ds.param_dtype bf16; this stand-in: fp32)
    # the reply segment: each episode's first reply, whole, after the prompt as sampled
    batch = probe_batch(episodes, 2, tok, "<think>", probe.pad_id)
    _, replies, owners = Probe(ProbeSection(every=1, num_samples=8, segment="reply"), tok).pairs(batch, 0)
    assert owners == [0, 0, 1, 1]
    assert [tok.decode(z, skip_special_tokens=True) for z in replies] == [REPLIES[0][0]] * 4


def test_a_controller_whose_run_directory_is_replaced_stops_before_writing_into_the_new_one(trainer, tmp_path):
    import shutil

    from ragen2.engines.openrlhf.run_files import RunFiles
    from ragen2.run_dir import RunDirectoryGone

    run = tmp_path / "run"
    trainer.ragen.files = RunFiles(run)
    status, step = trainer.train_step(samples(), 0)
    trainer.save_logs_and_checkpoints(step, status, {})
    calls = trainer.calls["logs"]
    assert len(calls) == 1 and (run / "metrics.jsonl").is_file() and (run / "completions.jsonl").is_file()
    shutil.rmtree(run)
    run.mkdir()  # another run of the same name
    with pytest.raises(RunDirectoryGone, match="removed or replaced"):  # at the step's sample completions
        trainer.train_step(samples(), step)
    with pytest.raises(RunDirectoryGone, match="stopped after step 1 without writing to it again"):
        trainer.save_logs_and_checkpoints(step, status, {})
    assert len(calls) == 1  # OpenRLHF's checkpoint save was never reached
    with pytest.raises(RunDirectoryGone):
        trainer.ragen.files.finish(2, 0, None)
    assert list(run.iterdir()) == []  # no row, completion, checkpoint or summary.json in the new run


def test_the_actor_group_forward_pads_micro_batches_to_every_rank_and_keeps_order(monkeypatch, trainer):
    class Group:
        _actor_handlers = [object()] * 3

        def async_run_method_batch(self, method_name, sequences, action_mask, attention_mask):
            assert method_name == "forward" and len(sequences) >= 3
            size = -(-len(sequences) // 3)
            return [[s.float() * 10 for s in sequences[i:i + size]] for i in range(0, len(sequences), size)]

    monkeypatch.setattr(trainer_patch.ray, "get", lambda refs: refs)
    trainer.actor_model_group = Group()
    seqs = [torch.tensor([[1, 2]]), torch.tensor([[3, 4]])]
    out = trainer._actor_log_probs(seqs, [None, None], [None, None])
    assert [o.tolist() for o in out] == [[[10.0, 20.0]], [[30.0, 40.0]]]


# ----------------------------------------------------------------------------- the launched process


def test_launch_main_installs_the_subclass_and_hands_the_flags_to_train_ppo_ray(tmp_path, monkeypatch):
    import json
    import sys

    import ray

    from ragen2.engines.openrlhf import SETTINGS_ENV, launch

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"version": 1, "group_size": 4}))
    ppo_module = sys.modules["openrlhf.trainer.ppo_trainer"]
    monkeypatch.setattr(ppo_module, "PPOTrainer", ppo_module.PPOTrainer)  # restored after the test
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv(SETTINGS_ENV, "")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.setdefault("init", kwargs))
    monkeypatch.setattr(launch.runpy, "run_module", lambda name, run_name, alter_sys: seen.setdefault(
        "run", (name, run_name, list(sys.argv), ppo_module.PPOTrainer)))
    launch.main(["--ragen2.settings", str(settings), "--actor.model_name_or_path", "m", "--train.colocate_all"])
    name, run_name, argv, trainer_class = seen["run"]
    assert (name, run_name) == ("openrlhf.cli.train_ppo_ray", "__main__")
    assert argv == ["openrlhf.cli.train_ppo_ray", "--actor.model_name_or_path", "m", "--train.colocate_all"]
    assert trainer_class is trainer_patch.RemoteRagenPPOTrainer
    env_vars = seen["init"]["runtime_env"]["env_vars"]
    assert json.loads(env_vars[SETTINGS_ENV]) == {"version": 1, "group_size": 4}
    assert env_vars["NCCL_DEBUG"] and env_vars["TOKENIZERS_PARALLELISM"]  # train_ppo_ray's own defaults kept


def test_the_controller_writes_the_run_directory_files_the_bench_reads(trainer, tmp_path, monkeypatch):
    """metrics.jsonl per logged step and eval, summary.json when fit returns: in the local keys."""
    from ragen2.engines.openrlhf.run_files import RunFiles

    trainer.ragen.files = RunFiles(tmp_path)
    rollout = {"rollout/reward_mean": 0.25, "policy_loss": 0.5, "generated_samples": ["text", 0.1]}

    def fit(self):  # OpenRLHF's loop, reduced to the calls it makes per step
        for step, batch in enumerate([samples([[1.0] * 4] * 6), samples(), samples()]):
            status, global_step = self.train_step(batch, step)
            status.update(rollout)
            self.save_logs_and_checkpoints(global_step, status, {})
            self.evaluate(global_step)

    monkeypatch.setattr(trainer_patch._Base, "fit", fit)
    monkeypatch.setattr(trainer_patch._Base, "evaluate", lambda self, step, **kw: {"eval_bandit_pass1": 0.3,
                                                                                  "eval_bandit_pass4": 0.8})
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Step 0 was skipped (no spread): its row has the rollout and filter metrics only; steps 1 and 2
    # trained; the one eval (val_every=0) comes after the last step.
    assert [row["step"] for row in rows] == [0, 1, 2, 2]
    assert rows[0]["snr/skipped"] == 1.0 and rows[0]["rollout/reward_mean"] == 1.0 and "policy_loss" not in rows[0]
    assert rows[1]["rollout/reward_mean"] == 0.25 and rows[1]["ragen2/skipped_steps"] == 1.0
    assert "generated_samples" not in rows[1]  # not a number
    assert rows[3]["val/reward_mean"] == 0.3 and rows[3]["val/max_reward_mean"] == 0.8
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["steps"], summary["steps_trained"], summary["steps_skipped"]) == (3, 2, 1)
    assert summary["final_val_success_rate"] is None and summary["final_val_reward_mean"] == 0.3
    assert summary["engine"] == "openrlhf"
    # trainer.log_completions=2: each step's best and worst sample (before the filter), skipped steps too
    from ragen2.run_dir import read_completions

    recorded = [(r["step"], r["rank"], r["group"], r["member"], r["reward"], r["kept"])
                for r in read_completions(tmp_path)]
    assert recorded == [(0, "best", 0, 0, 1.0, False), (0, "worst", 0, 1, 1.0, False),
                        (1, "best", 0, 0, 1.0, False), (1, "worst", 1, 0, 0.0, True),
                        (2, "best", 0, 0, 1.0, False), (2, "worst", 1, 0, 0.0, True)]
