"""`ragen2 audit RUN RUN ...`: the claim-2 proxies side by side per run and across runs."""

import json

import pytest
from scipy import stats

from ragen2.cli import main
from ragen2.reports.audit_runs import audit_runs


def _run(folder, success, mi, entropy):
    folder.mkdir()
    rows = [{"step": s, "rollout/success_rate": y, "probe/mi_zscore_ema": m, "actor/entropy": e}
            for s, (y, m, e) in enumerate(zip(success, mi, entropy))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def four_runs(tmp_path):
    # MI follows success in every run; entropy goes against it in two runs and with it in two
    return [_run(tmp_path / "a", [0.1, 0.2, 0.4, 0.5], [0.1, 0.3, 0.2, 0.9], [3.0, 2.0, 1.0, 0.5]),
            _run(tmp_path / "b", [0.0, 0.1, 0.1, 0.3], [0.0, 0.2, 0.1, 0.4], [1.0, 2.0, 3.0, 4.0]),
            _run(tmp_path / "c", [0.5, 0.4, 0.7, 0.8], [0.5, 0.6, 0.8, 1.2], [2.0, 2.5, 1.5, 1.0]),
            _run(tmp_path / "d", [0.2, 0.2, 0.3, 0.6], [0.2, 0.1, 0.3, 1.0], [0.5, 0.6, 0.9, 1.1])]


def test_within_and_across_run_correlations_equal_scipys(four_runs):
    result = audit_runs(four_runs)
    mi_rhos = [stats.spearmanr(m, y).statistic for y, m in
               [([0.1, 0.2, 0.4, 0.5], [0.1, 0.3, 0.2, 0.9]), ([0.0, 0.1, 0.1, 0.3], [0.0, 0.2, 0.1, 0.4]),
                ([0.5, 0.4, 0.7, 0.8], [0.5, 0.6, 0.8, 1.2]), ([0.2, 0.2, 0.3, 0.6], [0.2, 0.1, 0.3, 1.0])]]
    assert [r["rho"]["probe/mi_zscore_ema"] for r in result["runs"]] == pytest.approx(mi_rhos)
    mi, entropy = result["across_runs"][0], result["across_runs"][1]
    assert mi["mean_within_run_rho"] == pytest.approx(sum(mi_rhos) / 4) and mi["positive_within_run"] == 4
    assert entropy["positive_within_run"] == 2
    # last values: success 0.5, 0.3, 0.8, 0.6 against MI 0.9, 0.4, 1.2, 1.0: the same ranks
    assert mi["across_run_rho"] == pytest.approx(1.0)
    assert entropy["across_run_rho"] == pytest.approx(stats.spearmanr([0.5, 4.0, 1.0, 1.1], [0.5, 0.3, 0.8, 0.6]).statistic)


def test_the_command_prints_the_runs_side_by_side_and_writes_json(four_runs, tmp_path, capsys):
    out = tmp_path / "claim2.json"
    assert main(["audit", *map(str, four_runs), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MI-ZScore-EMA" in text and "Policy token entropy" in text and "4 of 4 positive" in text
    assert all(run.name in text for run in four_runs)
    assert json.loads(out.read_text())["across_runs"][0]["runs_with_final"] == 4


def test_a_missing_run_among_several_is_a_clear_error(four_runs, tmp_path, capsys):
    assert main(["audit", str(four_runs[0]), str(tmp_path / "nope")]) == 2
    assert "nope: not a directory" in capsys.readouterr().err
