"""Numerical parity (1e-6) of ragen2/algos with OpenRLHF 0.11.2 on the same tensors.

PolicyLoss (clip-higher, dual clip, both aggregations, gradients included) and
get_advantages_and_returns (GAE). Group normalisation (GRPO) goes through OpenRLHF's
compute_advantages_and_returns in test_openrlhf_trainer.py, on a batch our filter produced.
"""

from __future__ import annotations

import pytest
import torch

from tests.ragen2.engines.openrlhf import openrlhf_stubs

modules = openrlhf_stubs.load()
PolicyLoss = modules["openrlhf.models.loss"].PolicyLoss
RemoteExperienceMaker = modules["openrlhf.trainer.ppo_utils.experience_maker"].RemoteExperienceMaker

from ragen2.algos import gae_advantages, ppo_clip_policy_loss  # noqa: E402

TOL = 1e-6


def masks_single_turn(batch=6, width=40, seed=0) -> torch.Tensor:
    """Action-aligned masks as OpenRLHF builds them: prompt zeros, one response span, right padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, width, dtype=torch.bool)
    for row in range(batch):
        start = int(torch.randint(1, 12, (1,), generator=g))
        end = int(torch.randint(start + 1, width + 1, (1,), generator=g))
        mask[row, start:end] = True
    return mask


def masks_multi_turn(batch=5, width=48, seed=1) -> torch.Tensor:
    """Several assistant spans per row with env/template tokens between them."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, width, dtype=torch.bool)
    for row in range(batch):
        at = int(torch.randint(2, 6, (1,), generator=g))
        for _ in range(int(torch.randint(2, 4, (1,), generator=g))):
            length, gap = (int(torch.randint(2, 8, (1,), generator=g)) for _ in range(2))
            if at + length > width:
                break
            mask[row, at:at + length] = True
            at += length + gap
    return mask


def loss_inputs(mask: torch.Tensor, seed=2):
    g = torch.Generator().manual_seed(seed)
    shape = mask.shape
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    # Ratios well outside [0.8, 1.28] (and past the dual-clip cap 3) so every branch is hit.
    new = old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.6
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    return new.requires_grad_(True), old, adv


@pytest.mark.parametrize("agg,token_level", [("token-mean", True), ("seq-mean-token-mean", False)])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_policy_loss_with_clip_higher_matches_openrlhf(agg, token_level, dual_clip):
    mask = masks_multi_turn()
    new, old, adv = loss_inputs(mask)
    ratio = torch.exp(new.detach() - old)
    assert bool(((ratio > 1.28) & mask).any()) and bool(((ratio < 0.8) & mask).any())
    if dual_clip is not None:
        assert bool(((ratio > dual_clip) & (adv < 0) & mask).any())

    theirs, *_ = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=dual_clip,
                            token_level_loss=token_level)(new, old, adv, action_mask=mask.to(torch.float64))
    (their_grad,) = torch.autograd.grad(theirs, new)
    ours, _ = ppo_clip_policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip,
                                   agg_mode=agg)
    (our_grad,) = torch.autograd.grad(ours, new)
    assert abs(ours.item() - theirs.item()) < TOL
    assert torch.allclose(our_grad, their_grad, atol=TOL, rtol=0)


def their_gae(values, rewards, mask, gamma, lam):
    return RemoteExperienceMaker.get_advantages_and_returns(None, values, rewards, mask.to(values.dtype), gamma, lam)


def gae_inputs(mask, seed=3):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    # a reward on the last token of every span, as the agent's env rewards would sit
    ends = mask.clone()
    ends[:, :-1] &= ~mask[:, 1:]
    rewards[ends] = torch.randn(int(ends.sum()), generator=g, dtype=torch.float64)
    return values, rewards


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_openrlhf_on_single_turn_rows_for_any_gamma_and_lambda(gamma, lam):
    mask = masks_single_turn()
    values, rewards = gae_inputs(mask)
    their_adv, their_ret = their_gae(values, rewards, mask, gamma, lam)
    our_adv, our_ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, whiten=False)
    assert torch.allclose(our_adv[mask], their_adv[mask], atol=TOL, rtol=0)
    assert torch.allclose(our_ret[mask], their_ret[mask], atol=TOL, rtol=0)


def test_gae_matches_openrlhf_on_multi_turn_rows_with_gamma_and_lambda_one():
    mask = masks_multi_turn()
    values, rewards = gae_inputs(mask)
    their_adv, their_ret = their_gae(values, rewards, mask, 1.0, 1.0)
    our_adv, our_ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(our_adv[mask], their_adv[mask], atol=TOL, rtol=0)
    assert torch.allclose(our_ret[mask], their_ret[mask], atol=TOL, rtol=0)


def test_multi_turn_gae_with_discounting_differs_which_is_why_the_translation_refuses_it():
    mask = masks_multi_turn()
    values, rewards = gae_inputs(mask)
    their_adv, _ = their_gae(values, rewards, mask, 0.9, 0.9)
    our_adv, _ = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.9, whiten=False)
    # OpenRLHF discounts across the env tokens between turns; ragen2 skips them.
    assert not torch.allclose(our_adv[mask], their_adv[mask], atol=1e-3)
