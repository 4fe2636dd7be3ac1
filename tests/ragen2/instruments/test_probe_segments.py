"""The probe's two segments: RAGEN-2's reasoning (between <think> and </think>) and the whole
reply (every sampled token of a turn), which has a row for every rollout."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import mi_probe
from ragen2.config import ProbeSection
from ragen2.instruments.probe import Probe, reply_spans
from tests.tiny import SCRIPTED_SOKOBAN_REPLIES, scripted_sokoban_batch, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")
GEN_PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def test_reply_spans_are_each_turns_contiguous_sampled_tokens():
    turn_index = torch.tensor([[-1, -1, 0, 0, 0, -1, 1, 1, -1, -1],
                               [-1, 0, 0, 1, 1, -1, -1, -1, -1, 2],  # two turns back to back; one at the end
                               [-1] * 10])  # nothing sampled (a padded row)
    assert reply_spans(turn_index) == [(0, 0, 2, 5), (0, 1, 6, 8), (1, 0, 1, 3), (1, 1, 3, 5), (1, 2, 9, 10)]


def _format_failure_batch():
    """Groups 0, 0, 1, 2, replies from position 4. Only row 0 closed its </think> (reasoning
    4..6); the other rows are format failures with no reasoning span, as is common early on."""
    ids = torch.arange(40).reshape(4, 10)
    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[:, 4:] = True
    mask[3, 8:] = False  # row 3's reply is shorter
    turn_index = torch.where(mask, 0, -1)
    return SimpleNamespace(group_ids=torch.tensor([0, 0, 1, 2]), response_mask=mask, input_ids=ids,
                           turn_index=turn_index, reasoning_spans=[(0, 0, 5, 7)], traj_index=torch.arange(4))


def test_reply_segment_scores_every_rollouts_first_reply_under_the_prompt_as_sampled(tok):
    batch = _format_failure_batch()
    reasoning = Probe(ProbeSection(num_samples=64), tok).pairs(batch, step=0)
    assert reasoning[1] == [[5, 6]] and reasoning[2] == [0]  # one row, one column: no probe
    prompts, replies, owners = Probe(ProbeSection(num_samples=64, segment="reply"), tok).pairs(batch, step=0)
    # every group has a column; its prompt is the context before the reply, with no <think> added
    assert prompts == [[0, 1, 2, 3], [20, 21, 22, 23], [30, 31, 32, 33]]
    assert replies == [[4, 5, 6, 7, 8, 9], [14, 15, 16, 17, 18, 19], [24, 25, 26, 27, 28, 29], [34, 35, 36, 37]]
    assert owners == [0, 0, 1, 2]


def test_reply_segment_metrics_equal_the_reference_cross_scoring(tok):
    model = tiny_llama(tok)
    batch = _format_failure_batch()
    probe = Probe(ProbeSection(num_samples=64, segment="reply"), tok)
    metrics = probe.measure(model, batch, step=0, update_ema=False)
    prompts, replies, owners = probe.pairs(batch, step=0)
    scores = mi_probe.cross_score_naive(model, prompts, replies, owners)
    expected = mi_probe.mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids)
    assert metrics["probe/num_rows"] == 4 and metrics["probe/num_prompts"] == 3
    assert metrics["probe/retrieval_chance_level@1"] == pytest.approx(1 / 3)
    assert metrics["probe/mi_estimate"] == pytest.approx(expected["mi_estimate"], abs=1e-5)


def test_reply_segment_on_a_real_rollout_decodes_to_what_the_policy_wrote(tok):
    batch = scripted_sokoban_batch(tok, GEN_PROMPT)
    probe = Probe(ProbeSection(mode="trajectory", num_samples=64, segment="reply"), tok)
    spans = probe.segment_spans(batch)
    assert len(spans) == 12  # 4 trajectories x 3 turns; turn 2 ("I refuse") has a reply, not reasoning
    texts = {tok.decode(batch.input_ids[row, start:end], skip_special_tokens=True) for row, _, start, end in spans}
    assert texts == set(SCRIPTED_SOKOBAN_REPLIES.values())
    prompts, replies, _ = probe.pairs(batch, step=0)
    assert all(tok.decode(p).endswith(GEN_PROMPT) for p in prompts)  # the context just before the reply


def test_probe_dtype_scores_in_fp32_inside_an_autocast_or_under_the_policys_bf16(tok):
    """probe.dtype=float32 scores in fp32 even when called inside a bf16 autocast (MI comparable
    across machines); the default scores under the policy's own autocast, so its MI differs from
    fp32's by bf16's error, not by nothing; each row says which it scored in."""
    from ragen2 import precision

    model = precision.set_compute_dtype(tiny_llama(tok, hidden_size=64), "bfloat16")
    batch = _format_failure_batch()
    fp32_probe = Probe(ProbeSection(num_samples=64, segment="reply", dtype="float32"), tok)
    reference = fp32_probe.measure(tiny_llama(tok, hidden_size=64), batch, step=0, update_ema=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = fp32_probe.measure(model, batch, step=0, update_ema=False)
    assert inside == reference and inside["probe/dtype"] == "float32"
    policy_probe = Probe(ProbeSection(num_samples=64, segment="reply"), tok)  # the default
    in_bf16 = policy_probe.measure(model, batch, step=0, update_ema=False)
    assert in_bf16["probe/dtype"] == "bfloat16"
    assert in_bf16["probe/mi_estimate"] != reference["probe/mi_estimate"]
    assert in_bf16["probe/mi_estimate"] == pytest.approx(reference["probe/mi_estimate"], abs=0.05)
    # a policy that computes in fp32 (a CPU without bf16 units) is scored in fp32 by the default,
    # the same numbers as probe.dtype=float32, even inside a caller's bf16 autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32_policy = Probe(ProbeSection(num_samples=64, segment="reply"), tok).measure(
            tiny_llama(tok, hidden_size=64), batch, step=0, update_ema=False)
    assert fp32_policy == reference
