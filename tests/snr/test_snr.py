"""snr/: group selection, presets, loss scaling (the skip/stop policy: test_stopping.py).

Expected values are worked out by hand in the comments. Variances use ddof=1
unless a test says otherwise: var([0,0,0,1]) = 0.75/3 = 0.25,
var([0,2,0,2]) = 4/3, var([0,0,1,1]) = 1/3, var([0,1]) = 0.5.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import snr
from snr import FilterConfig, FilterConfigError, FilterInputError, select_groups

# Four groups of G=4; variances 0.25, 0, 4/3, 1/3 (total 23/12); stds 0.5, 0, 1.1547, 0.57735.
REWARDS = torch.tensor([[0.0, 0, 0, 1], [1, 1, 1, 1], [0, 2, 0, 2], [0, 0, 1, 1]])


def recommended(**changes):
    """RAGEN-2's recommended filter (the snr-top-p preset: linear top-p 0.9 on the variance,
    zero-spread groups dropped) with `changes`; FilterConfig's own default keeps every group."""
    return FilterConfig(**{"strategy": "top_p", "value": 0.9, "include_zero": False, **changes})


def kept(rewards, scores=None, **cfg):
    return select_groups(rewards, recommended(**cfg), scores=scores).kept.tolist()


def given_kept(scores, **cfg):
    # Rank by caller scores; rewards [0, 1] per group so no group is zero-spread.
    rewards = torch.tensor([[0.0, 1.0]] * len(scores))
    return kept(rewards, scores=torch.tensor(scores, dtype=torch.float64), metric="given", **cfg)


# ---------------------------------------------------------------- spreads

def test_group_spread_values_and_ddof():
    var, std, zero = snr.group_spread(REWARDS)
    assert var.tolist() == pytest.approx([0.25, 0.0, 4 / 3, 1 / 3])
    assert std.tolist() == pytest.approx([0.5, 0.0, math.sqrt(4 / 3), math.sqrt(1 / 3)])
    assert zero.tolist() == [False, True, False, False]
    var0, _, _ = snr.group_spread(REWARDS, ddof=0)  # divides by G = 4
    assert var0.tolist() == pytest.approx([0.1875, 0.0, 1.0, 0.25])


def test_group_spread_of_grouped_lists_matches_the_matrix_and_takes_uneven_groups():
    # Lists of one length are a matrix; lists of several lengths are spread per group, with ddof.
    rows = REWARDS.tolist()
    for ddof in (0, 1):
        for got, want in zip(snr.group_spread(rows, ddof), snr.group_spread(REWARDS, ddof)):
            assert torch.equal(got, want)
    var, std, zero = snr.group_spread([[0.0, 1.0], [0.0, 0.0, 3.0], [2.0]])
    assert var.tolist() == pytest.approx([0.5, 3.0, 0.0])  # var([0, 0, 3]) = (1 + 1 + 4) / 2
    assert zero.tolist() == [False, False, True]  # one rollout: no spread observed
    var0, _, _ = snr.group_spread([[0.0, 1.0], [0.0, 0.0, 3.0], [2.0]], ddof=0)
    assert var0.tolist() == pytest.approx([0.25, 2.0, 0.0])
    with pytest.raises(FilterInputError, match="ddof must be 0 or 1"):
        snr.group_spread(REWARDS, ddof=2)
    with pytest.raises(FilterInputError, match="at least one group and one rollout"):
        snr.group_spread([[0.0, 1.0], []])


def test_equal_rewards_have_exactly_zero_spread():
    # float64 round-off gives var([0.1]*3) ~ 3e-34; we report exactly 0.
    var, std, zero = snr.group_spread(torch.tensor([[0.1, 0.1, 0.1]]))
    assert var.item() == 0.0 and std.item() == 0.0 and zero.item()


# ---------------------------------------------------------------- top_p linear

def test_top_p_linear_by_variance_with_metrics():
    # slack 0.01 * (23/12) / 2.23205 (summed std) = 0.00859, the share of the total RAGEN's 0.01
    # is of the summed std; threshold 0.8 * 23/12 - 0.00859 = 1.5247; 4/3 < it, 5/3 >= it -> 2, 3.
    sel = select_groups(REWARDS, recommended(value=0.8, include_zero=True))
    assert sel.kept.tolist() == [2, 3] and not sel.skip
    assert sel.scores.tolist() == pytest.approx([0.25, 0.0, 4 / 3, 1 / 3])
    m = sel.metrics
    assert m["snr/groups_total"] == 4 and m["snr/groups_kept"] == 2 and m["snr/kept_fraction"] == 0.5
    assert m["snr/kept_reward_variance_share"] == pytest.approx((5 / 3) / (23 / 12))  # 20/23
    assert m["snr/skipped"] == 0.0 and m["snr/zero_spread_groups"] == 1
    assert m["snr/reward_variance_mean"] == pytest.approx(23 / 48)
    assert (m["snr/reward_variance_min"], m["snr/reward_variance_max"]) == pytest.approx((0.0, 4 / 3))
    assert m["snr/reward_std_mean"] == pytest.approx((0.5 + 1.1547005 + 0.5773503) / 4)
    assert m["snr/kept_reward_variance_mean"] == pytest.approx(5 / 6)
    assert (m["snr/kept_reward_std_min"], m["snr/kept_reward_std_max"]) == pytest.approx((0.5773503, 1.1547005))


def test_top_p_linear_metric_changes_the_ranking_mass():
    # By std: total 2.23205, threshold 0.8 * 2.23205 - 0.01 = 1.77564;
    # 1.1547 + 0.57735 = 1.73205 falls short, adding 0.5 reaches it -> groups 0, 2, 3.
    assert kept(REWARDS, value=0.8, metric="reward_std") == [0, 2, 3]
    # p = 0.9 by variance: threshold 1.725 - 0.00859 = 1.7164; 5/3 < it, + 0.25 -> groups 0, 2, 3.
    assert kept(REWARDS, value=0.9) == [0, 2, 3]


@pytest.mark.parametrize(
    ("scores", "p", "expected"),
    [
        ([4.0, 3.0, 2.0, 1.0], 0.6, [0, 1]),  # threshold 5.99: 4 + 3 (RAGEN's own example)
        ([10.0, 1.0, 0.0, 0.0], 0.9, [0]),  # threshold 9.89: 10
        ([3.0, 1.0, 1.0, 0.0], 0.9, [0, 1, 2]),  # threshold 4.49: 3 + 1 + 1
        ([1.0, 1.0, 1.0, 1.0], 0.5, [0, 1]),  # ties: threshold 1.99 -> first two by index
        ([-1.0, 3.0, 2.0], 0.5, [1]),  # total 4, threshold 1.99: 3; negatives never kept
    ],
)
def test_top_p_linear_given_scores(scores, p, expected):
    assert given_kept(scores, value=p, include_zero=True) == expected


def test_top_p_linear_skips_when_total_spread_is_zero_or_below_eps():
    all_equal = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    sel = select_groups(all_equal, recommended(value=0.9, include_zero=True))
    assert sel.skip and sel.kept.numel() == 0
    assert sel.metrics["snr/skipped"] == 1.0 and sel.metrics["snr/kept_reward_std_mean"] == 0.0
    assert sel.metrics["snr/kept_reward_variance_share"] == 0.0
    # std([0, 0.01]) = 0.00707: 0.9 * 0.00707 < eps 0.01, so the threshold p * var - slack
    # (slack 0.01 * var / std) is below 0 on the variance as on the std: nothing worth keeping.
    tiny = torch.tensor([[0.0, 0.01]])
    assert select_groups(tiny, recommended()).skip and select_groups(tiny, recommended(metric="reward_std")).skip


def test_small_real_variance_is_kept_not_skipped():
    # One group of 8 with rewards [0, 0, 0, 0.1]: variance 0.0025, std 0.05. An absolute eps 0.01
    # on the variance made the threshold 0.9 * 0.0025 - 0.01 < 0 and skipped the step; the
    # slack is now 0.01 * 0.0025 / 0.05 = 0.0005, threshold 0.00175 > 0, and the group is kept,
    # as snr-top-p-std (RAGEN's std) keeps it: 0.9 * 0.05 - 0.01 = 0.035 <= 0.05.
    rewards = torch.zeros(8, 4)
    rewards[5, 3] = 0.1
    for preset in ("snr-top-p", "snr-top-p-std"):
        sel = select_groups(rewards, snr.load_preset(preset))
        assert not sel.skip and sel.kept.tolist() == [5], preset
    assert snr.selection.linear_top_p_slack(recommended(), torch.tensor([0.0025]), torch.tensor([0.05])) == (
        pytest.approx(0.0005))
    # std and caller scores keep RAGEN's absolute eps
    assert snr.selection.linear_top_p_slack(recommended(metric="reward_std"), torch.tensor([5.0]),
                                            torch.tensor([5.0])) == 0.01


def test_ddof_changes_the_spread_scale_and_so_the_eps_cutoff():
    # std([0, 0.02]) = 0.01414 (ddof 1) or 0.01 (ddof 0); a batch is skipped when
    # p * summed std <= eps: 0.0127 > 0.01 (keep), 0.009 <= 0.01 (skip).
    rewards = torch.tensor([[0.0, 0.02]])
    assert kept(rewards, ddof=1) == [0]
    assert select_groups(rewards, recommended(ddof=0)).skip


def test_top_p_one_keeps_every_candidate():
    # RAGEN's "no filter" setting: p = 1 keeps all, even all-zero groups, unless include_zero=False.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [3.0, 3.0], [0.0, 2.0]])
    assert kept(rewards, value=1.0, include_zero=True) == [0, 1, 2, 3]
    assert kept(rewards, value=1.0, include_zero=False) == [1, 3]


# ---------------------------------------------------------------- top_p softmax

def test_top_p_softmax_ties_and_all_zero_spread_never_empty():
    # Uniform probabilities 1/3: cumulative 1/3, 2/3 >= 0.6 -> two groups, by index.
    assert given_kept([1.0, 1.0, 1.0], value=0.6, top_p_mode="softmax") == [0, 1]
    all_equal = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    assert kept(all_equal, value=0.5, top_p_mode="softmax", include_zero=True) == [0, 1]
    assert kept(all_equal, value=0.9, top_p_mode="softmax", include_zero=True) == [0, 1, 2]
    # With zero-spread groups dropped there is nothing left to keep.
    assert select_groups(all_equal, recommended(top_p_mode="softmax", include_zero=False)).skip


def test_top_p_softmax_exact_boundary_ties_keep_the_shortest_prefix():
    # 10 tied groups: each has mass 0.1, so 9 of them reach p = 0.9 exactly. In float64 the
    # running sum after 9 is 0.8999999999999999, which once took a 10th group.
    assert given_kept([0.5] * 10, value=0.9, top_p_mode="softmax") == list(range(9))
    assert given_kept([0.5] * 4, value=0.75, top_p_mode="softmax") == [0, 1, 2]
    # A p really above the mass of 2 of 3 groups (2/3 + 1e-9) still takes the third.
    assert given_kept([1.0, 1.0, 1.0], value=2 / 3 + 1e-9, top_p_mode="softmax") == [0, 1, 2]


def test_top_p_softmax_one_nonzero_group():
    # Variances [0, 0.5, 0]; probs e^0.5 / (2 + e^0.5) = 0.4519 < 0.5, then group 0
    # (tied with 2, lower index) adds 0.2741 -> 0.726 >= 0.5.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 2.0]])
    assert kept(rewards, value=0.5, top_p_mode="softmax", include_zero=True) == [0, 1]
    assert kept(rewards, value=0.5, top_p_mode="softmax", include_zero=False) == [1]
    assert kept(rewards, value=0.9) == [1]  # linear: threshold 0.44 <= 0.5
    assert kept(rewards, strategy="top_k", value=0.25, include_zero=True) == [1]  # k = max(1, int(0.75))
    assert kept(rewards, strategy="min_p", value=0.5, include_zero=True) == [1]  # >= 0.25


def test_top_p_softmax_smallest():
    # probs of -[3,1,4,1,5] / 0.8106: group 1 0.4538 < 0.5, group 3 -> 0.9077.
    assert given_kept([3.0, 1.0, 4.0, 1.0, 5.0], value=0.5, top_p_mode="softmax", order="smallest") == [1, 3]


# ---------------------------------------------------------------- top_k, top_k_abs, min_p, none

@pytest.mark.parametrize(
    ("num_groups", "value", "expected_count"),
    [(8, 0.25, 2), (5, 0.1, 1), (100, 0.29, 29), (3, 1.0, 3)],  # 0.29*100 = 28.999999999999996
)
def test_top_k_count(num_groups, value, expected_count):
    scores = [float(i) for i in range(num_groups)]
    got = given_kept(scores, strategy="top_k", value=value)
    assert got == list(range(num_groups - expected_count, num_groups))


def test_top_k_include_zero_both_ways():
    # Variances [0, 0.5, 0, 2]; k = int(0.75 * 4) = 3.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [3.0, 3.0], [0.0, 2.0]])
    assert kept(rewards, strategy="top_k", value=0.75, include_zero=True) == [0, 1, 3]  # tie 0/2 -> 0
    assert kept(rewards, strategy="top_k", value=0.75, include_zero=False) == [1, 3]  # only 2 candidates


def test_top_k_abs_ties_order_and_cap():
    scores = [2.0, 1.0, 2.0, 1.0, 2.0]
    assert given_kept(scores, strategy="top_k_abs", value=2) == [0, 2]
    assert given_kept(scores, strategy="top_k_abs", value=1, order="smallest") == [1]
    assert given_kept(scores, strategy="top_k_abs", value=10) == [0, 1, 2, 3, 4]


def test_order_smallest():
    scores = [3.0, 1.0, 4.0, 1.0, 5.0]
    # Ascending 1, 1, 3, 4: running sums 1, 2, 5, 9 >= 0.5 * 14 - 0.01.
    assert given_kept(scores, value=0.5, order="smallest") == [0, 1, 2, 3]
    assert given_kept(scores, strategy="min_p", value=0.5, order="smallest") == [1, 3]  # <= 1 / 0.5
    assert given_kept(scores, strategy="min_p", value=0.25, order="smallest") == [0, 1, 2, 3]  # <= 4
    # A zero score is passed over, not a stop (RAGEN would return nothing here):
    # total 3, threshold 1.49: 1 (group 2), then 2 (group 1).
    assert given_kept([0.0, 2.0, 1.0], value=0.5, order="smallest", include_zero=True) == [1, 2]


def test_min_p_largest():
    assert given_kept([4.0, 2.0, 1.0, 3.0], strategy="min_p", value=0.5) == [0, 1, 3]  # >= 2
    assert given_kept([2.0, 2.0, 1.0], strategy="min_p", value=1.0) == [0, 1]
    assert given_kept([2.0, 2.0, 1.0], strategy="min_p", value=0.0) == [0, 1, 2]


def test_none_keeps_everything_even_single_rollouts():
    rewards = torch.tensor([[1.0], [0.0], [1.0]])  # G = 1: no spread, but no ranking either
    sel = select_groups(rewards, FilterConfig(strategy="none"))
    assert sel.kept.tolist() == [0, 1, 2] and not sel.skip
    assert sel.metrics["snr/reward_std_max"] == 0.0


def test_single_group():
    assert kept(torch.tensor([[0.0, 1.0]])) == [0]  # threshold 0.44 <= 0.5
    assert kept(torch.tensor([[0.0, 1.0]]), strategy="top_k", value=0.25) == [0]
    assert select_groups(torch.tensor([[1.0, 1.0]]), recommended()).skip


def test_given_scores_and_int_rewards_and_masks():
    rewards = torch.tensor([[0, 1], [1, 1], [0, 1]])  # ints are accepted
    sel = select_groups(rewards, recommended(metric="given", strategy="top_k_abs", value=1, include_zero=True),
                        scores=torch.tensor([0.5, 9.0, 2.0]))
    assert sel.kept.tolist() == [1] and sel.scores.tolist() == [0.5, 9.0, 2.0]
    assert sel.group_mask().tolist() == [False, True, False]
    assert sel.sample_mask(2).tolist() == [False, False, True, True, False, False]
    # include_zero=False drops zero *reward* spread even when ranking by a given score.
    sel = select_groups(rewards, recommended(metric="given", strategy="top_k_abs", value=1, include_zero=False),
                        scores=[0.5, 9.0, 2.0])
    assert sel.kept.tolist() == [2]


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        (torch.tensor([[0.0, 1.0], [float("nan"), 1.0]]), "NaN or infinite.*group 1, rollout 0"),
        (torch.tensor([[0.0, float("inf")]]), "NaN or infinite.*group 0, rollout 1"),
        (torch.tensor([0.0, 1.0, 1.0]), "2-D tensor"),
        (torch.zeros(2, 2, 2), "2-D tensor"),
        (torch.zeros(0, 4), "at least one group"),
        (torch.tensor([[1.0], [0.0]]), "group_size is 1.*at least 2 rollouts"),
    ],
)
def test_bad_rewards(rewards, match):
    with pytest.raises(FilterInputError, match=match):
        select_groups(rewards, recommended())


def test_bad_scores():
    rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(FilterInputError, match="pass scores"):
        select_groups(rewards, recommended(metric="given"))
    with pytest.raises(FilterInputError, match="use metric 'given'"):
        select_groups(rewards, recommended(), scores=[1.0, 2.0])
    with pytest.raises(FilterInputError, match="one score per group \\(2\\)"):
        select_groups(rewards, recommended(metric="given"), scores=[1.0, 2.0, 3.0])
    with pytest.raises(FilterInputError, match="first at group 1"):
        select_groups(rewards, recommended(metric="given"), scores=[1.0, float("nan")])
    with pytest.raises(FilterInputError, match="must be a FilterConfig"):
        select_groups(rewards, {"strategy": "top_p"})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"strategy": "top_q"}, "strategy must be one of top_p, top_k, top_k_abs, min_p, none"),
        ({"metric": "variance"}, "metric must be one of reward_variance, reward_std, given"),
        ({"metric": "entropy"}, "pass it as `scores` with metric 'given'"),
        ({"order": "biggest"}, "order must be one of largest, smallest"),
        ({"top_p_mode": "cubic"}, "top_p_mode must be one of linear, softmax"),
        ({"value": 0.0}, r"strategy top_p must be in \(0, 1\]"),
        ({"value": 1.5}, r"strategy top_p must be in \(0, 1\]"),
        ({"strategy": "top_k", "value": 0.0}, r"strategy top_k must be in \(0, 1\]"),
        ({"strategy": "top_k_abs", "value": 2.5}, "whole number >= 1"),
        ({"strategy": "top_k_abs", "value": 0}, "whole number >= 1"),
        ({"strategy": "min_p", "value": 1.2}, r"strategy min_p must be in \[0, 1\]"),
        ({"value": float("nan")}, "value must be finite"),
        ({"value": True}, "value must be a number"),
        ({"value": "0.9"}, "value must be a number"),
        ({"eps": -0.1}, "eps must be >= 0"),
        ({"ddof": 2}, "ddof must be 0 or 1"),
        ({"include_zero": "false"}, "include_zero must be true or false"),
        ({"strategy": "none", "include_zero": False}, "use strategy top_p with value 1.0"),
    ],
)
def test_bad_config(fields, match):
    with pytest.raises(FilterConfigError, match=match):
        recommended(**fields)


# ---------------------------------------------------------------- presets

def test_presets_load_and_validate():
    names = snr.available_presets()
    assert {"none", "starpo-s", "snr-top-p", "snr-top-k", "snr-min-p"} <= set(names)
    for name in names:
        assert isinstance(snr.load_preset(name), FilterConfig)
    assert snr.load_preset("starpo-s") == recommended(
        strategy="top_k", value=0.25, metric="reward_std", include_zero=True)
    assert snr.load_preset("snr-top-p") == recommended(
        strategy="top_p", value=0.9, metric="reward_variance", top_p_mode="linear", include_zero=False)
    assert snr.load_preset("none").strategy == "none"
    assert snr.load_preset("SNR_top_p") == snr.load_preset("snr-top-p")  # case, _ and - ignored
    assert snr.load_preset(snr.PRESETS_DIR / "snr-min-p.yaml").strategy == "min_p"


def test_preset_errors(tmp_path):
    with pytest.raises(FilterConfigError, match="unknown filter preset 'top-q'.*available: .*snr-top-p"):
        snr.load_preset("top-q")
    (tmp_path / "typo.yaml").write_text("strategy: top_p\nvalu: 0.9\n")
    with pytest.raises(FilterConfigError, match=r"unknown filter config field\(s\) \['valu'\]"):
        snr.load_preset(tmp_path / "typo.yaml")
    (tmp_path / "range.yaml").write_text("strategy: top_k\nvalue: 2\n")
    with pytest.raises(FilterConfigError, match="range.yaml: value for strategy top_k"):
        snr.load_preset("range", presets_dir=tmp_path)
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(FilterConfigError, match="is empty"):
        snr.load_preset(tmp_path / "empty.yaml")
    with pytest.raises(FilterConfigError, match="does not exist"):
        snr.load_preset(tmp_path / "missing.yaml")


# ---------------------------------------------------------------- loss scaling

def test_kept_fraction_scale():
    assert snr.kept_fraction_scale(0.25, "none") == 1.0
    assert snr.kept_fraction_scale(0.25, "linear") == 0.25
    assert snr.kept_fraction_scale(0.25, "sqrt") == 0.5
    with pytest.raises(ValueError, match="one of none, linear, sqrt"):
        snr.kept_fraction_scale(0.5, "log")
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        snr.kept_fraction_scale(1.5, "linear")


# ---------------------------------------------------------------- properties

reward_values = st.sampled_from([0.0, 1.0, -0.1, 0.5, 2.0])


@st.composite
def batches(draw):
    num_groups = draw(st.integers(1, 12))
    group_size = draw(st.integers(2, 5))
    rows = draw(st.lists(st.lists(reward_values, min_size=group_size, max_size=group_size),
                         min_size=num_groups, max_size=num_groups))
    return torch.tensor(rows)


configs = st.one_of(
    st.builds(FilterConfig, strategy=st.just("top_p"), value=st.floats(0.05, 1.0),
              top_p_mode=st.sampled_from(["linear", "softmax"])),
    st.builds(FilterConfig, strategy=st.just("top_k"), value=st.floats(0.05, 1.0)),
    st.builds(FilterConfig, strategy=st.just("top_k_abs"), value=st.integers(1, 15)),
    st.builds(FilterConfig, strategy=st.just("min_p"), value=st.floats(0.0, 1.0)),
)


@settings(max_examples=300, deadline=None)
@given(rewards=batches(), cfg=configs, include_zero=st.booleans(), order=st.sampled_from(["largest", "smallest"]),
       metric=st.sampled_from(["reward_variance", "reward_std"]))
def test_selection_properties(rewards, cfg, include_zero, order, metric):
    cfg = recommended(**{**cfg.to_dict(), "include_zero": include_zero, "order": order, "metric": metric})
    sel = select_groups(rewards, cfg)
    k = sel.kept.tolist()
    assert k == sorted(set(k)) and all(0 <= i < rewards.shape[0] for i in k)
    assert sel.skip == (len(k) == 0) and sel.metrics["snr/groups_kept"] == len(k)
    if not include_zero:
        assert not snr.group_spread(rewards)[2][sel.kept].any()
    if cfg.strategy == "top_p" and cfg.top_p_mode == "linear" and not sel.skip:
        total = float(sel.scores.sum())
        kept_mass = float(sel.scores[sel.kept].sum())
        # zero-spread groups score 0 with std 0: the sums over all groups are the candidates'
        slack = snr.selection.linear_top_p_slack(cfg, sel.scores, snr.group_spread(rewards, cfg.ddof)[1])
        assert kept_mass >= cfg.value * total - slack - 1e-12
        if cfg.value < 1 and order == "largest":  # shortest prefix: one group fewer falls short
            assert kept_mass - float(sel.scores[sel.kept].min()) < cfg.value * total - slack
    if cfg.strategy == "top_p" and cfg.top_p_mode == "softmax" and include_zero:
        assert not sel.skip


def test_the_default_filter_keeps_every_group_and_the_recommended_one_is_a_preset():
    # one default per field: the training config's (no filter); RAGEN-2's recommendation is snr-top-p
    assert FilterConfig() == snr.load_preset("none")
    assert select_groups(REWARDS).kept.tolist() == [0, 1, 2, 3]
    assert snr.load_preset("snr-top-p") == recommended()
