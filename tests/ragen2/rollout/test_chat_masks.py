"""Incremental chat-template tokenization and loss masks, on ChatML and Llama-3 templates.

RAGEN once trained with inverted masks for months; these tests pin, token by token, that the
mask is 1 on exactly what the policy sampled and 0 on every system/user/template token.
Expected transcripts are written out by hand.
"""

import pytest
import torch

from ragen2.rollout.chat import ChatFormat, ChatTemplateError, TokenTrajectory, reasoning_span, reply_text
from tests.tiny import tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save

SYSTEM = {"role": "system", "content": "SYS"}
USER_1 = "\nTurn 1:\nState:\nA\n"
USER_2 = "Reward:\n-0.1\n\nTurn 2:\nState:\nB\n"  # RAGEN: the reward and the next state in one message
USER_3 = "Reward:\n0\n\nTurn 3:\nState:\nC\n"


@pytest.fixture(scope="module")
def chatml():
    return tiny_tokenizer("chatml")


@pytest.fixture(scope="module")
def llama3():
    return tiny_tokenizer("llama3")


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def build(tok, replies):
    """Run a conversation through TokenTrajectory; replies are (text, sampled_eos)."""
    chat = ChatFormat(tok)
    traj = TokenTrajectory(chat, [SYSTEM, {"role": "user", "content": USER_1}])
    users = [USER_2, USER_3]
    for k, (text, with_eos) in enumerate(replies):
        ids = encode(tok, text) + ([tok.eos_token_id] if with_eos else [])
        logprobs = [-0.5 - k] * len(ids)
        traj.add_reply(ids, logprobs, reply_text(chat, ids, with_eos), ended_with_eos=with_eos)
        if k < len(replies) - 1:
            traj.add_user(users[k])
    return traj


def masked_pieces(tok, traj):
    """Decoded sampled spans (one string per turn) and the decoded unsampled tokens, in order."""
    spans = [tok.decode(traj.input_ids[a:b], skip_special_tokens=False) for a, b in traj.turn_spans]
    rest = [t for t, s in zip(traj.input_ids, traj.sampled) if not s]
    return spans, tok.decode(rest, skip_special_tokens=False)


REPLIES = [("<think>x</think><answer>Up</answer>", False),   # stopped at </answer>: template closes it
           ("<think>y</think><answer>Down</answer>", True),  # sampled EOS: kept, not doubled
           ("<answer>Left</answer>", False)]


def test_chatml_masks_cover_exactly_the_sampled_tokens(chatml):
    traj = build(chatml, REPLIES)
    head = "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n\nTurn 1:\nState:\nA\n<|im_end|>\n<|im_start|>assistant\n"
    close_1 = "<|im_end|>\n<|im_start|>user\nReward:\n-0.1\n\nTurn 2:\nState:\nB\n<|im_end|>\n<|im_start|>assistant\n"
    close_2 = "\n<|im_start|>user\nReward:\n0\n\nTurn 3:\nState:\nC\n<|im_end|>\n<|im_start|>assistant\n"
    whole = chatml.decode(traj.input_ids, skip_special_tokens=False)
    assert whole == (head + REPLIES[0][0] + close_1 + REPLIES[1][0] + "<|im_end|>" + close_2 + REPLIES[2][0])

    spans, rest = masked_pieces(chatml, traj)
    assert spans == [REPLIES[0][0], REPLIES[1][0] + "<|im_end|>", REPLIES[2][0]]
    assert rest == head + close_1 + close_2
    # Token-level: the <|im_end|> we append after </answer> is template (0); the sampled one is 1.
    im_end = chatml.convert_tokens_to_ids("<|im_end|>")
    first_end, second_end = traj.turn_spans[0][1], traj.turn_spans[1][1]
    assert traj.input_ids[first_end] == im_end and traj.sampled[first_end] is False
    assert traj.input_ids[second_end - 1] == im_end and traj.sampled[second_end - 1] is True
    assert traj.input_ids[second_end] != im_end  # not doubled
    # The whole list equals the template's own render of the conversation (full fidelity).
    assert whole == ChatFormat(chatml).render(traj.messages, add_generation_prompt=False).removesuffix("<|im_end|>\n")


def test_chatml_turn_index_and_logprobs_follow_the_mask(chatml):
    traj = build(chatml, REPLIES)
    assert sum(traj.sampled) == sum(b - a for a, b in traj.turn_spans)
    for k, (a, b) in enumerate(traj.turn_spans):
        assert traj.turn_index[a:b] == [k] * (b - a)
        assert traj.logprobs[a:b] == [-0.5 - k] * (b - a)
    outside = [i for i, s in enumerate(traj.sampled) if not s]
    assert all(traj.turn_index[i] == -1 and traj.logprobs[i] == 0.0 for i in outside)
    assert traj.last_sampled_end() == len(traj.input_ids)  # last turn: nothing appended after it


def test_llama3_masks_with_trimmed_template_and_single_bos(llama3):
    replies = [("<think>x</think><answer>Up</answer>\n", False),  # the template trims; the sampled \n stays
               ("<think>y</think><answer>Down</answer>", True),
               ("<answer>Left</answer>", False)]
    traj = build(llama3, replies)
    head = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSYS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nTurn 1:\nState:\nA<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    close_1 = ("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nReward:\n-0.1\n\nTurn 2:\nState:\nB<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n")
    close_2 = ("<|start_header_id|>user<|end_header_id|>\n\nReward:\n0\n\nTurn 3:\nState:\nC<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n")
    spans, rest = masked_pieces(llama3, traj)
    assert spans == [replies[0][0], replies[1][0] + "<|eot_id|>", replies[2][0]]
    assert rest == head + close_1 + close_2
    bos = llama3.convert_tokens_to_ids("<|begin_of_text|>")
    assert traj.input_ids.count(bos) == 1 and traj.input_ids[0] == bos


def test_reply_text_drops_the_final_eos_only(chatml):
    chat = ChatFormat(chatml)
    ids = encode(chatml, "<answer>Up</answer>") + [chatml.eos_token_id]
    assert reply_text(chat, ids, ended_with_eos=True) == "<answer>Up</answer>"
    assert reply_text(chat, ids[:-1], ended_with_eos=False) == "<answer>Up</answer>"


def test_a_template_that_rewrites_past_turns_is_named_in_the_error(chatml):
    # Qwen3-style: earlier assistant turns lose their <think> block when re-rendered.
    tok = tiny_tokenizer("chatml")
    tok.chat_template = (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' %}{% set c = c.split('</think>')[-1] %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    tok.name_or_path = "qwen3-like"
    with pytest.raises(ChatTemplateError, match=r"'qwen3-like' breaks the prefix property.*context='window'"):
        build(tok, REPLIES[:2])


def test_a_tokenizer_without_a_template_gets_a_clear_error():
    tok = tiny_tokenizer("chatml")
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat_template"):
        ChatFormat(tok)


def test_turn_order_is_enforced(chatml):
    traj = TokenTrajectory(ChatFormat(chatml), [SYSTEM, {"role": "user", "content": USER_1}])
    with pytest.raises(RuntimeError, match="add_user before any reply"):
        traj.add_user(USER_2)
    ids = encode(chatml, "<answer>Up</answer>")
    traj.add_reply(ids, [0.0] * len(ids), "<answer>Up</answer>", ended_with_eos=False)
    with pytest.raises(RuntimeError, match="add_reply twice"):
        traj.add_reply(ids, [0.0] * len(ids), "<answer>Up</answer>", ended_with_eos=False)
    with pytest.raises(ValueError, match="one log-prob per token"):
        TokenTrajectory(ChatFormat(chatml), [SYSTEM]).add_reply(ids, [0.0], "x", ended_with_eos=False)


@pytest.mark.parametrize("text, reasoning", [
    ("<think> abc déf </think><answer>Up</answer>", " abc déf"),  # " </" straddles the tag: left out
    ("<think>ab</think> <answer>Up</answer>", "ab"),
    ("pre <think>go left\n</think><answer>Left</answer>", "go left\n"),
])
def test_reasoning_span_is_the_tokens_between_the_think_tags(chatml, text, reasoning):
    chat = ChatFormat(chatml)
    ids = encode(chatml, text)
    start, end = reasoning_span(chat, ids)
    assert chatml.decode(ids[:start]).endswith("<think>")
    assert chatml.decode(ids[start:end]) == reasoning


@pytest.mark.parametrize("text", ["<answer>Up</answer>", "<think>never closed", "<think></think><answer>x</answer>"])
def test_reasoning_span_is_none_without_a_closed_nonempty_think(chatml, text):
    assert reasoning_span(ChatFormat(chatml), encode(chatml, text)) is None
