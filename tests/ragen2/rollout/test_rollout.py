"""Generation (KV cache, batching, stops, seeding) and the agent loop (groups, rewards, masks, windows).

Models are built in-process: a tiny random LlamaForCausalLM, and ScriptedPolicy, whose logits
force a scripted answer so the env receives known text and rewards are checked by hand.
"""

import re

import pytest
import torch

import envs
from envs.prompt import NO_VALID_ACTION_WARNING
from ragen2.rollout import (
    RolloutBatch, RolloutConfig, RolloutConfigError, TrajectoryRecord, evaluate, generate, generate_one_at_a_time,
    group_pass_rate, rollout,
)
from ragen2.rollout.generation import sample_tokens
from tests.tiny import ScriptedPolicy

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save
GEN_PROMPT = "<|im_start|>assistant\n"


def greedy_kwargs(tok, **overrides):
    kwargs = dict(max_new_tokens=8, temperature=0, stop_strings=(), eos_token_ids=(),
                  pad_token_id=tok.pad_token_id, tokenizer=tok)
    return {**kwargs, **overrides}


def prompts_of(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


PROMPTS = ["Turn 1:\nState:\n#_P", "a", "<think> push the box </think> and more words here"]


# --- generation --------------------------------------------------------------------------------


def test_kv_cache_generation_equals_a_no_cache_greedy_loop(tok, llama):
    results = generate(llama, prompts_of(tok, PROMPTS), **greedy_kwargs(tok))
    for prompt, result in zip(prompts_of(tok, PROMPTS), results):
        ids, logprobs = list(prompt), []
        with torch.no_grad():
            for _ in range(8):  # full forward over the whole sequence each step, no cache, no padding
                logits = llama(input_ids=torch.tensor([ids])).logits[0, -1].float()
                token = int(logits.argmax())
                logprobs.append(float(torch.log_softmax(logits, -1)[token]))
                ids.append(token)
        assert result.token_ids == ids[len(prompt):]
        assert result.logprobs == pytest.approx(logprobs, abs=1e-5)
        assert result.finish_reason == "length"


def test_batched_equals_one_at_a_time_with_rows_finishing_apart(tok, llama):
    prompts = prompts_of(tok, PROMPTS)
    full = generate(llama, prompts, **greedy_kwargs(tok))
    # An "EOS" that row 0 emits at its 3rd step makes rows finish at different steps.
    eos = full[0].token_ids[2]
    kwargs = greedy_kwargs(tok, eos_token_ids=[eos])
    batched = generate(llama, prompts, **kwargs)
    single = generate_one_at_a_time(llama, prompts, **kwargs)
    assert len(batched[0].token_ids) <= 3 and batched[0].finish_reason == "eos"
    assert len({len(r.token_ids) for r in batched}) > 1  # rows really finished at different steps
    for b, s, f in zip(batched, single, full):
        assert b.token_ids == s.token_ids
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-5)
        cut = f.token_ids.index(eos) + 1 if eos in f.token_ids else len(f.token_ids)
        assert b.token_ids == f.token_ids[:cut]  # stops right at the first EOS, EOS kept


def test_identical_prompts_are_prefilled_once_and_then_sampled_apart(tok, llama):
    prompts = prompts_of(tok, [PROMPTS[0], PROMPTS[2], PROMPTS[0], PROMPTS[0]])
    shapes = []
    hook = llama.register_forward_pre_hook(lambda _m, _a, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        batched = generate(llama, prompts, **greedy_kwargs(tok))
    finally:
        hook.remove()
    assert shapes[0] == (2, len(prompts[1]))  # the prefill: 2 distinct prompts, right-padded to the longest
    assert set(shapes[1:]) == {(4, 1)}  # then all 4 rows decode
    single = generate_one_at_a_time(llama, prompts, **greedy_kwargs(tok))
    for b, s in zip(batched, single):
        assert b.token_ids == s.token_ids and b.logprobs == pytest.approx(s.logprobs, abs=1e-5)
    sampled = generate(llama, prompts, max_new_tokens=10, temperature=1.0, pad_token_id=tok.pad_token_id,
                       tokenizer=tok, generator=torch.Generator().manual_seed(0))
    assert len({tuple(sampled[i].token_ids) for i in (0, 2, 3)}) > 1  # copies draw their own tokens


def test_stop_string_eos_and_length(tok):
    prompt = prompts_of(tok, ["<|im_start|>user\nhi<|im_end|>\n" + GEN_PROMPT])
    stop_policy = ScriptedPolicy(tok, lambda _: "<think>a</think><answer>Up</answer> extra words", generation_prompt=GEN_PROMPT)
    [stopped] = generate(stop_policy, prompt, **greedy_kwargs(tok, max_new_tokens=40, stop_strings=("</answer>",)))
    assert tok.decode(stopped.token_ids) == "<think>a</think><answer>Up</answer>"  # "</answer>" is 3 tokens here
    assert stopped.finish_reason == "stop"

    eos_policy = ScriptedPolicy(tok, lambda _: "no tags", generation_prompt=GEN_PROMPT, end_with_eos=True)
    [ended] = generate(eos_policy, prompt, **greedy_kwargs(tok, max_new_tokens=40, eos_token_ids=[tok.eos_token_id]))
    assert ended.token_ids == tok.encode("no tags", add_special_tokens=False) + [tok.eos_token_id]
    assert ended.finish_reason == "eos" and ended.logprobs == pytest.approx([0.0] * len(ended.token_ids), abs=1e-9)

    [cut] = generate(stop_policy, prompt, **greedy_kwargs(tok, max_new_tokens=3, stop_strings=("</answer>",)))
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"


def test_sampling_is_reproducible_from_the_generator(tok, llama):
    def run(seed):
        return generate(llama, prompts_of(tok, PROMPTS), max_new_tokens=10, temperature=1.0, top_p=0.9,
                        pad_token_id=tok.pad_token_id, tokenizer=tok, generator=torch.Generator().manual_seed(seed))
    a, b, c = run(7), run(7), run(8)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_sample_tokens_temperature_and_top_p():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprobs = sample_tokens(logits, 0, 1.0, None)
    assert tokens.tolist() == [1, 0]
    assert logprobs.tolist() == pytest.approx(torch.log_softmax(logits, -1).max(-1).values.tolist())
    # top_p this small keeps only the most likely token; the log-prob is of the full T-scaled distribution.
    tokens, logprobs = sample_tokens(logits, 0.5, 1e-6, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1, 0]
    assert logprobs.tolist() == pytest.approx(torch.log_softmax(logits / 0.5, -1).max(-1).values.tolist())


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[[]]), "prompt 0 is empty"),
    (dict(prompts=[]), "at least one prompt"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(stop_strings=("</answer>",), tokenizer=None), "need a tokenizer"),
    (dict(stop_strings="</answer>"), "not one string"),
])
def test_generate_rejects_bad_arguments(tok, llama, kwargs, message):
    args = dict(prompts=[[1, 2]], max_new_tokens=2, temperature=1.0, top_p=1.0, tokenizer=tok)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        generate(llama, args.pop("prompts"), **args)


def test_generate_restores_training_mode(tok, llama):
    llama.train()
    generate(llama, [[1, 2]], **greedy_kwargs(tok, max_new_tokens=1))
    assert llama.training
    llama.eval()


# --- the agent loop with a scripted policy ------------------------------------------------------

SOKOBAN_SCRIPT = {1: "<think>up</think><answer>Up</answer>", 2: "I refuse", 3: "<think>down</think><answer>Down</answer>"}


def sokoban_policy(tok):
    def respond(prompt):
        turn = int(re.findall(r"Turn (\d+):", prompt)[-1])
        return SOKOBAN_SCRIPT[turn]
    return ScriptedPolicy(tok, respond, generation_prompt=GEN_PROMPT, end_with_eos=True)


def sokoban_factory(**env_config):
    return lambda: envs.make("sokoban", format_penalty=-0.5, **env_config)


def run_sokoban(tok, seeds=(3,), env_config=None, **config):
    cfg = RolloutConfig(**{"group_size": 2, "max_turns": 3, "max_new_tokens": 40, "prefill_tag": False, **config})
    return rollout(sokoban_policy(tok), tok, sokoban_factory(**(env_config or {})), list(seeds), cfg,
                   torch.Generator().manual_seed(0))


def decode_masked(tok, batch, row):
    ids, mask = batch.input_ids[row], batch.response_mask[row].bool()
    return tok.decode(ids[mask], skip_special_tokens=False)


def test_multi_turn_rewards_sit_on_the_right_tokens(tok):
    # Seed 3: the player steps Up onto an empty target (-0.1), then writes no tags (format
    # penalty -0.5, nothing moves), then steps Down (-0.1): -0.7 in all.
    batch = run_sokoban(tok)
    for t in batch.trajectories:
        assert t.turn_rewards == pytest.approx([-0.1, -0.5, -0.1])
        assert t.finish_reasons == ["stop", "eos", "stop"]
        assert t.format_ok == [True, False, True] and t.parse_errors[1] == "no <think> tag"
        assert t.response_texts == [SOKOBAN_SCRIPT[1], "I refuse", SOKOBAN_SCRIPT[3]]
    assert batch.traj_rewards.tolist() == pytest.approx([-0.7, -0.7])
    assert batch.num_turns.tolist() == [3, 3] and batch.traj_index.tolist() == [0, 1]
    for row in range(2):
        sampled = batch.response_mask[row].nonzero().flatten().tolist()
        assert batch.token_rewards[row].nonzero().flatten().tolist() == [sampled[-1]]
        assert batch.token_rewards[row, sampled[-1]].item() == pytest.approx(-0.7)
        turn_ends = [max(i for i in sampled if batch.turn_index[row, i] == k) for k in range(3)]
        assert batch.turn_rewards[row].nonzero().flatten().tolist() == turn_ends
        assert batch.turn_rewards[row, turn_ends].tolist() == pytest.approx([-0.1, -0.5, -0.1])
        assert decode_masked(tok, batch, row) == SOKOBAN_SCRIPT[1] + "I refuse<|im_end|>" + SOKOBAN_SCRIPT[3]
        assert (batch.sampling_logprobs[row] != 0).sum() <= len(sampled)  # nothing outside the mask
        assert batch.input_ids[row, int(batch.attention_mask[row].sum()) - 1] == batch.input_ids[row, sampled[-1]]


def test_full_history_prompt_layout_follows_ragen(tok):
    batch = run_sokoban(tok)
    text = tok.decode(batch.input_ids[0][batch.attention_mask[0].bool()])
    # The reward and the next turn's state share one user message; after the invalid turn the
    # warning appears and the action budget is unchanged.
    assert f"{SOKOBAN_SCRIPT[1]}<|im_end|>\n<|im_start|>user\nReward:\n-0.1\n\nTurn 2:\nState:\n" in text
    # The invalid turn is trained on -0.5 but shows RAGEN-2's env reward: nothing ran, str(0) = "0".
    assert "I refuse<|im_end|>\n<|im_start|>user\nReward:\n0\n\nTurn 3:\nState:\n" in text
    turn_3 = text[text.index("Turn 3:"):]
    assert NO_VALID_ACTION_WARNING in turn_3 and "You have 9 actions left" in turn_3
    assert text.count("<|im_start|>system") == 1 and text.endswith(SOKOBAN_SCRIPT[3])


def test_format_penalty_reaches_the_reward_on_bandit(tok):
    policy = ScriptedPolicy(tok, lambda _: "I pick the first one", generation_prompt=GEN_PROMPT, end_with_eos=True)
    cfg = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=30, prefill_tag=False)
    batch = rollout(policy, tok, lambda: envs.make("bandit"), [0], cfg, torch.Generator().manual_seed(0))
    assert batch.traj_rewards.tolist() == pytest.approx([-0.1, -0.1])
    for row in range(2):
        end = int(batch.response_mask[row].nonzero().max())  # the last sampled token (the EOS)
        assert batch.input_ids[row, end] == tok.eos_token_id
        assert batch.token_rewards[row, end].item() == pytest.approx(-0.1)
        assert batch.turn_rewards[row, end].item() == pytest.approx(-0.1)
    assert batch.metrics()["rollout/format_ok_fraction"] == 0.0


def test_group_members_share_the_instance_and_groups_differ(tok):
    policy = ScriptedPolicy(tok, lambda _: "<answer>x</answer>", generation_prompt=GEN_PROMPT)
    cfg = RolloutConfig(group_size=3, max_turns=1, max_new_tokens=20, prefill_tag=False)
    batch = rollout(policy, tok, lambda: envs.make("bandit"), [0, 1], cfg, torch.Generator().manual_seed(0))
    prompts = [tok.decode(batch.input_ids[r][(batch.response_mask[r] == 0) & batch.attention_mask[r].bool()])
               for r in range(6)]
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert prompts[0] == prompts[1] == prompts[2] and prompts[3] == prompts[4] == prompts[5]
    assert "Banker" in prompts[0] and "Musician" in prompts[3]  # seeds 0 and 1 (see test_bandit)
    assert [(t.seed, t.member) for t in batch.trajectories] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_window_mode_makes_one_row_per_turn(tok):
    batch = run_sokoban(tok, window_turns=2, context="window")
    assert batch.traj_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.token_rewards.sum(-1).tolist() == pytest.approx([-0.7] * 6)
    assert batch.turn_rewards.sum(-1).tolist() == pytest.approx([-0.1, -0.5, -0.1] * 2)
    replies = [SOKOBAN_SCRIPT[1], "I refuse<|im_end|>", SOKOBAN_SCRIPT[3]]
    for row in range(6):
        k = row % 3
        assert decode_masked(tok, batch, row) == replies[k]
        sampled = batch.response_mask[row].nonzero().flatten()
        assert batch.turn_index[row, sampled].tolist() == [k] * len(sampled)
        assert int(batch.token_rewards[row].nonzero()) == int(sampled.max())
    texts = [tok.decode(batch.input_ids[r][batch.attention_mask[r].bool()]) for r in range(3)]
    assert "Turn 1:" in texts[0] and "Turn 2:" not in texts[0]
    assert "Turn 1:" in texts[1] and "Reward:\n-0.1\n\nTurn 2:" in texts[1]
    # Turn 3's window starts at turn 2, whose message drops the reward of turn 1.
    assert "Turn 1:" not in texts[2] and "<|im_start|>user\n\nTurn 2:" in texts[2]
    assert "Reward:\n0\n\nTurn 3:" in texts[2]


@pytest.mark.parametrize("context", ["full", "window"])
def test_reward_message_shows_the_penalty_only_when_asked(tok, context):
    batch = run_sokoban(tok, env_config={"reward_feedback": "with_penalty"}, context=context, window_turns=2)
    rows = (0, 0) if context == "full" else (1, 2)  # window: turn 2's and turn 3's rows
    texts = [tok.decode(batch.input_ids[r][batch.attention_mask[r].bool()]) for r in rows]
    assert "Reward:\n-0.1\n\nTurn 2:" in texts[0] and "Reward:\n-0.5\n\nTurn 3:" in texts[1]
    assert [sum(t.turn_rewards) for t in batch.trajectories] == pytest.approx([-0.7, -0.7])  # trained on


def test_context_limit_ends_a_trajectory_and_is_counted(tok):
    first_prompt = int((run_sokoban(tok, max_turns=1).response_mask[0] == 0).sum())
    batch = run_sokoban(tok, max_context_tokens=first_prompt + 40)  # turn 2 cannot fit
    assert batch.num_turns.tolist() == [1, 1] and batch.context_truncated.all()
    assert batch.metrics()["rollout/context_truncated"] == 2.0
    assert batch.input_ids.shape[1] == first_prompt + len(tok.encode(SOKOBAN_SCRIPT[1], add_special_tokens=False))
    with pytest.raises(RolloutConfigError, match="first prompt of group 0"):
        run_sokoban(tok, max_context_tokens=first_prompt + 39)


def test_select_groups_keeps_whole_groups_in_order(tok):
    batch = run_sokoban(tok, seeds=(3, 4, 5), max_turns=1)
    kept = batch.select_groups([2, 0])
    assert kept.group_ids.tolist() == [0, 0, 2, 2] and kept.traj_index.tolist() == [0, 1, 2, 3]
    assert [t.seed for t in kept.trajectories] == [3, 3, 5, 5]
    assert torch.equal(kept.input_ids[2:, : kept.input_ids.shape[1]], batch.input_ids[4:, : kept.input_ids.shape[1]])
    assert [s[0] for s in kept.reasoning_spans] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"groups \[7\] are not in this batch"):
        batch.select_groups([7])


def test_concat_renumbers_groups_and_keeps_rows_spans_and_padding(tok):
    """Dynamic sampling's rounds joined: groups of different rounds never share an id."""
    long, short = run_sokoban(tok, seeds=(3, 4)).select_groups([1]), run_sokoban(tok, seeds=(5,), max_turns=1)
    joined = RolloutBatch.concat([short, long])
    assert joined.group_ids.tolist() == [0, 0, 1, 1] and [t.group for t in joined.trajectories] == [0, 0, 1, 1]
    assert [t.seed for t in joined.trajectories] == [5, 5, 4, 4] and joined.traj_index.tolist() == [0, 1, 2, 3]
    width = max(short.input_ids.shape[1], long.input_ids.shape[1])
    assert joined.input_ids.shape[1] == width > short.input_ids.shape[1]
    assert joined.num_tokens == short.num_tokens + long.num_tokens  # padding adds no real token
    assert joined.num_response_tokens == short.num_response_tokens + long.num_response_tokens
    assert (joined.turn_index[:2, short.input_ids.shape[1]:] == -1).all()
    assert joined.reasoning_spans == short.reasoning_spans + [(row + 2, *span) for row, *span in long.reasoning_spans]
    assert torch.equal(joined.input_ids[2:, :long.input_ids.shape[1]], long.input_ids)
    assert joined.reward_matrix().tolist() == [[t.reward for t in b.trajectories] for b in (short, long)]
    with pytest.raises(ValueError, match="at least one batch"):
        RolloutBatch.concat([])


def test_reasoning_spans_point_at_the_think_text(tok):
    batch = run_sokoban(tok)
    assert [(row, turn) for row, turn, _, _ in batch.reasoning_spans] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    for row, turn, start, end in batch.reasoning_spans:
        assert tok.decode(batch.input_ids[row, :start]).endswith("<think>")
        assert tok.decode(batch.input_ids[row, start:end]) == ["up", "", "down"][turn]
    lengths = [len(tok.encode(w, add_special_tokens=False)) for w in ("up", "down")]
    assert batch.trajectories[0].think_lengths == [lengths[0], 0, lengths[1]]


def test_evaluate_success_and_pass_at_g(tok):
    # Always pull the first arm shown: seed 0 shows the safe arm first, seed 1 the risky one.
    def respond(prompt):
        first = re.findall(r"There are 2 arms, named (\w+) and", prompt)[0]  # RAGEN-2's observation
        return f"<think>first</think><answer>{first}</answer>"
    policy = ScriptedPolicy(tok, respond, generation_prompt=GEN_PROMPT)
    cfg = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=30, prefill_tag=False)
    result = evaluate(policy, tok, lambda: envs.make("bandit"), [0, 1], cfg, torch.Generator().manual_seed(0))
    assert result["val/success_rate"] == 0.5 and result["val/pass@2"] == 0.5 and result["val/num_groups"] == 2
    records = [TrajectoryRecord(0, 0, 0, success=False), TrajectoryRecord(0, 1, 0, success=True),
               TrajectoryRecord(1, 0, 1, success=False), TrajectoryRecord(1, 1, 1, success=False)]
    assert group_pass_rate(records) == 0.5


# --- the agent loop with a random tiny Llama --------------------------------------------------


def sample_rollout(tok, llama, seed, context="full"):
    cfg = RolloutConfig(group_size=2, max_turns=2, max_new_tokens=6, temperature=1.0, context=context,
                        max_context_tokens=2048)
    return rollout(llama, tok, lambda: envs.make("sokoban"), [3, 4], cfg, torch.Generator().manual_seed(seed))


def test_same_generator_seed_same_rollout(tok, llama):
    a, b, c = (sample_rollout(tok, llama, s) for s in (5, 5, 6))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.sampling_logprobs, b.sampling_logprobs)
    assert [t.response_texts for t in a.trajectories] == [t.response_texts for t in b.trajectories]
    assert [t.response_texts for t in a.trajectories] != [t.response_texts for t in c.trajectories]


@pytest.mark.parametrize("context", ["full", "window"])
def test_sampling_logprobs_match_a_trainer_forward(tok, llama, context):
    batch = sample_rollout(tok, llama, seed=1, context=context)
    mask = batch.response_mask.bool()
    assert int(mask.sum()) == sum(sum(t.response_lengths) for t in batch.trajectories)
    with torch.no_grad():  # what the trainer computes: one right-padded forward, no cache
        logits = llama(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    recomputed = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    assert not mask[:, 0].any()
    assert torch.allclose(recomputed[mask[:, 1:]], batch.sampling_logprobs[mask], atol=1e-4)
    assert (batch.sampling_logprobs[~mask] == 0).all() and (batch.turn_index[~mask] == -1).all()


def test_prefilled_think_tag_opens_every_turn_outside_the_mask(tok):
    # RAGEN's layout: the prompt ends with "<think>", the model continues inside the tag, and
    # the env sees the tag + the sampled text. The tag is prompt, not policy output (mask 0).
    policy = ScriptedPolicy(tok, lambda _: "risky pays more</think><answer>Banker</answer>",
                            generation_prompt="<think>")
    cfg = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=30)
    batch = rollout(policy, tok, lambda: envs.make("bandit"), [0], cfg, torch.Generator().manual_seed(0))
    for row, t in enumerate(batch.trajectories):
        assert t.response_texts == ["<think>risky pays more</think><answer>Banker</answer>"]
        assert t.format_ok == [True] and t.parse_errors == [None] and t.turn_rewards[0] >= 0
        assert decode_masked(tok, batch, row) == "risky pays more</think><answer>Banker</answer>"
        prompt_end = int(batch.response_mask[row].nonzero().min())
        assert tok.decode(batch.input_ids[row, :prompt_end]).endswith("<|im_start|>assistant\n<think>")
    (row, turn, start, end), *_ = batch.reasoning_spans
    assert tok.decode(batch.input_ids[row, start:end]) == "risky pays more"
