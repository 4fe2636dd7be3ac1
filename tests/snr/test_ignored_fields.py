"""A filter field set to a value its strategy does not read is refused, not silently dropped.

Issue 52 item 4: `select_groups(R, FilterConfig(value=0.5))` kept every group, because the
default strategy is none. Each field has its own case here, in the library, in a YAML preset
and through the training config's `filter.*` overrides.
"""

import pytest
import torch

import snr
from ragen2.cli import main
from ragen2.config import ConfigError, load_config
from snr import FilterConfig, FilterConfigError, select_groups

READ_BY_FILTERING = "it is read by strategy top_p, top_k, top_k_abs or min_p"


@pytest.mark.parametrize("field, value", [
    ("value", 0.5), ("metric", "reward_std"), ("order", "smallest"), ("include_zero", False),
    ("signal", "success"), ("top_p_mode", "softmax"), ("eps", 0.05),
])
def test_strategy_none_refuses_every_field_it_ignores(field, value):
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    with pytest.raises(FilterConfigError) as error:
        FilterConfig(**{field: value})
    message = str(error.value)
    assert message.startswith(f"{field}={shown} is ignored by strategy none, which keeps every group;")
    assert "\n" not in message  # one line
    reader = {"top_p_mode": "it is read by strategy top_p",
              "eps": "it is read by strategy top_p with top_p_mode linear"}
    assert reader.get(field, READ_BY_FILTERING) in message


def test_the_issue_example_no_longer_keeps_every_group_silently():
    # [[0,2],[0,1],[0,1],[0,1]] with "top-p 0.5" kept [0, 1, 2, 3] under the default strategy none
    with pytest.raises(FilterConfigError, match="value=0.5 is ignored by strategy none"):
        select_groups(torch.tensor([[0.0, 2], [0, 1], [0, 1], [0, 1]]), FilterConfig(value=0.5))
    # what the reader meant: group 0 holds 2/3.5 of the summed variance, group 1 brings it past 0.5
    meant = select_groups(torch.tensor([[0.0, 2], [0, 1], [0, 1], [0, 1]]), FilterConfig(strategy="top_p", value=0.5))
    assert meant.kept.tolist() == [0]


@pytest.mark.parametrize("strategy, value", [("top_k", 0.5), ("top_k_abs", 2), ("min_p", 0.5)])
def test_top_p_mode_and_eps_are_refused_outside_top_p(strategy, value):
    with pytest.raises(FilterConfigError, match=f"^top_p_mode=softmax is ignored by strategy {strategy}; "
                                                "it is read by strategy top_p$"):
        FilterConfig(strategy=strategy, value=value, top_p_mode="softmax")
    with pytest.raises(FilterConfigError, match=f"^eps=0.05 is ignored by strategy {strategy}; "
                                                "it is read by strategy top_p with top_p_mode linear$"):
        FilterConfig(strategy=strategy, value=value, eps=0.05)


def test_eps_is_refused_under_softmax_top_p_and_read_under_linear():
    with pytest.raises(FilterConfigError, match="^eps=0.05 is ignored by strategy top_p with top_p_mode softmax"):
        FilterConfig(strategy="top_p", value=0.9, top_p_mode="softmax", eps=0.05)
    assert FilterConfig(strategy="top_p", value=0.9, eps=0.05).eps == 0.05


def test_signal_is_refused_where_caller_scores_rank_and_no_group_is_dropped():
    with pytest.raises(FilterConfigError, match="^signal=success is ignored by metric given with include_zero true; "
                                                "it is read by metric reward_variance or reward_std"):
        FilterConfig(strategy="top_k", value=0.5, metric="given", signal="success")
    # with include_zero false the signal's spread decides which groups are dropped
    cfg = FilterConfig(strategy="top_k", value=0.5, metric="given", include_zero=False, signal="success")
    sel = select_groups(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), cfg, scores=torch.tensor([2.0, 1.0]),
                        signal=torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    assert sel.kept.tolist() == [1]  # group 0 scores higher but has no outcome spread


def test_several_ignored_fields_are_named_in_one_line():
    with pytest.raises(FilterConfigError) as error:
        FilterConfig(strategy="top_k", value=0.5, top_p_mode="softmax", eps=0.05)
    message = str(error.value)
    assert "\n" not in message and "top_p_mode=softmax" in message and "eps=0.05" in message


def test_include_zero_under_none_still_says_how_to_drop_zero_spread_groups():
    with pytest.raises(FilterConfigError, match="use strategy top_p with value 1.0 and include_zero false"):
        FilterConfig(include_zero=False)


def test_defaults_and_read_fields_are_accepted():
    # a field at its default is never refused (YAML presets write them out), ddof is read by the metrics
    assert FilterConfig(strategy="none", value=1.0, metric="reward_variance", order="largest",
                        top_p_mode="linear", include_zero=True, eps=0.01, signal="reward", ddof=0).ddof == 0
    for strategy, value in (("top_p", 0.9), ("top_k", 0.5), ("top_k_abs", 2), ("min_p", 0.5)):
        cfg = FilterConfig(strategy=strategy, value=value, metric="reward_std", order="smallest",
                           include_zero=False, signal="success")
        assert (cfg.metric, cfg.order, cfg.include_zero, cfg.signal) == ("reward_std", "smallest", False, "success")
    assert FilterConfig(strategy="top_p", value=0.9, top_p_mode="softmax").top_p_mode == "softmax"


def test_deciding_fields_are_the_fields_the_strategy_reads():
    assert FilterConfig().deciding_fields() == {"strategy": "none"}
    assert set(FilterConfig(strategy="top_k", value=0.5).deciding_fields()) == {
        "strategy", "value", "metric", "order", "include_zero", "ddof", "signal"}
    assert "eps" not in FilterConfig(strategy="top_p", value=0.9, top_p_mode="softmax").deciding_fields()
    assert "eps" in FilterConfig(strategy="top_p", value=0.9).deciding_fields()


def test_a_yaml_preset_with_an_ignored_field_is_refused_with_its_path(tmp_path):
    (tmp_path / "mine.yaml").write_text("strategy: top_k\nvalue: 0.25\ntop_p_mode: softmax\n")
    with pytest.raises(FilterConfigError, match=r"mine.yaml: top_p_mode=softmax is ignored by strategy top_k"):
        snr.load_preset(tmp_path / "mine.yaml")
    (tmp_path / "none2.yaml").write_text("strategy: none\nvalue: 0.5\n")
    with pytest.raises(FilterConfigError, match=r"none2.yaml: value=0.5 is ignored by strategy none"):
        snr.load_preset(tmp_path / "none2.yaml")


def test_shipped_presets_write_no_field_their_strategy_ignores():
    import yaml

    for name in snr.available_presets():
        written = yaml.safe_load((snr.PRESETS_DIR / f"{name}.yaml").read_text())
        cfg = snr.load_preset(name)
        unread = sorted(set(written) - set(cfg.deciding_fields()) - {"ddof"})
        assert not unread, f"preset {name} writes {unread}, which strategy {cfg.strategy} does not read"


@pytest.mark.parametrize("filter_preset, overrides, refused", [
    (None, ["filter.value=0.5"], "filter.value=0.5 is ignored by strategy none"),  # was labelled "filter none"
    (None, ["filter.metric=reward_std"], "filter.metric=reward_std is ignored by strategy none"),
    (None, ["filter.order=smallest"], "filter.order=smallest is ignored by strategy none"),
    (None, ["filter.signal=success"], "filter.signal=success is ignored by strategy none"),
    ("starpo-s", ["filter.eps=0.05"], "filter.eps=0.05 is ignored by strategy top_k"),
    ("starpo-s", ["filter.top_p_mode=softmax"], "filter.top_p_mode=softmax is ignored by strategy top_k"),
    ("ragen2-main", ["filter.strategy=top_k", "filter.value=0.25"],
     "filter.top_p_mode=softmax is ignored by strategy top_k"),
    ("snr-top-p", ["filter.strategy=none"], "filter.value=0.9 is ignored by strategy none"),
])
def test_training_config_overrides_are_refused(filter_preset, overrides, refused):
    with pytest.raises(ConfigError, match=refused):
        load_config(filter=filter_preset, overrides=overrides)


def test_training_config_takes_what_the_strategy_reads():
    cfg = load_config(overrides=["filter.strategy=top_p", "filter.value=0.5"])
    assert (cfg.filter.strategy, cfg.filter.value) == ("top_p", 0.5)
    assert load_config(filter="snr-top-p", overrides=["filter.eps=0.05"]).filter.eps == 0.05


def test_train_command_refuses_a_value_without_a_strategy(tmp_path, capsys):
    # `ragen2 train filter.value=0.5` ran unfiltered, labelled "filter none"
    code = main(["train", "--dry-run", "--out", str(tmp_path), "filter.value=0.5"])
    assert code == 2
    assert "filter.value=0.5 is ignored by strategy none" in capsys.readouterr().err
