"""`ragen2 bench report`: tables, CSV/JSON and plots rebuilt from fixture run directories with known numbers."""

import csv
import json
import math

import pytest
from pathlib import Path

from ragen2.bench.report import build_report, mean_std, percent, replace_block
from ragen2.cli import main

# final validation success of seed 0; seed 1 adds 0.1
FINAL = {("ppo", "sokoban", "none"): 0.10, ("ppo", "sokoban", "ragen2-main"): 0.30,
         ("ppo", "countdown", "none"): 0.50, ("ppo", "countdown", "ragen2-main"): 0.45,
         ("grpo", "sokoban", "none"): 0.20, ("grpo", "sokoban", "ragen2-main"): 0.20,
         ("grpo", "countdown", "none"): 0.60, ("grpo", "countdown", "ragen2-main"): 0.70}


def cell_record(out, algo, env, treatment, seed):
    name = f"{env}--{algo}--{treatment}--s{seed}"
    return {"name": name, "matrix": "main", "env": env, "algo": algo, "filter": treatment, "variant": "",
            "model": "bundled", "seed": seed, "treatment": treatment, "row": algo, "compare": "filter",
            "baseline": "none", "run_dir": str(out / "runs" / name), "settings": "2 steps x 2x4"}


def write_run(cell, final, skipped=0, wall=30.0, with_probe=False):
    run = Path(cell["run_dir"])
    run.mkdir(parents=True)
    rows = [
        {"step": 0, "rollout/reward_mean": final - 0.2, "rollout/success_rate": final / 2,
         "rollout/num_tokens": 100.0, "rollout/response_tokens_mean": 5.0, "rollout/num_trajectories": 4.0,
         "rollout/in_group_reward_std_mean": 0.3, "actor/entropy": 1.5, "snr/kept_fraction": 1.0,
         "snr/skipped": 0.0, "val/success_rate": final / 2, "val/reward_mean": 0.0, "val/pass@4": 0.5},
        {"step": 1, "rollout/reward_mean": final, "rollout/success_rate": final, "rollout/num_tokens": 120.0,
         "rollout/response_tokens_mean": 6.0, "rollout/num_trajectories": 4.0,
         "rollout/in_group_reward_std_mean": 0.2, "snr/kept_fraction": 0.5, "snr/skipped": float(skipped),
         "val/success_rate": final, "val/reward_mean": final - 0.1, "val/pass@4": 0.75},
    ]
    if with_probe:
        rows[0]["probe/mi_zscore_ema"], rows[1]["probe/mi_zscore_ema"] = 0.8, 0.6
    # budget counters: one optimiser step over 100 tokens per trained step, none on a skipped one
    rows[0].update({"update/tokens": 100.0, "update/optimizer_steps": 1.0})
    rows[1].update({"update/tokens": 0.0 if skipped else 120.0, "update/optimizer_steps": float(not skipped)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({
        "steps": 2, "steps_trained": 2 - skipped, "steps_skipped": skipped, "stop_reason": None,
        "final_val_success_rate": final, "best_val_success_rate": final, "wall_s_this_session": 11.0}))
    (run / "bench_cell.json").write_text(json.dumps({"status": "done", "wall_s": wall, "attempts": 1}))


@pytest.fixture
def bench(tmp_path):
    out = tmp_path / "bench"
    cells = []
    for seed in (0, 1):
        for (algo, env, treatment), final in FINAL.items():
            cell = cell_record(out, algo, env, treatment, seed)
            write_run(cell, round(final + 0.1 * seed, 10), skipped=int(treatment != "none"), wall=30.0 + seed,
                      with_probe=algo == "ppo")
            cells.append(cell)
    failed = cell_record(out, "dapo", "sokoban", "none", 0)
    Path(failed["run_dir"]).mkdir(parents=True)
    (out / "runs" / failed["name"] / "bench_cell.json").write_text(json.dumps(
        {"status": "failed", "reason": "RuntimeError: CUDA out of memory", "wall_s": 3.0}))
    cells.append(failed)
    (out / "bench.json").write_text(json.dumps({"suite": "main-table", "description": "fixture",
                                                "published": "ragen2-main", "engine": "local", "cells": cells}))
    return out


def test_csv_has_one_row_per_cell_with_the_known_numbers(bench):
    paths = build_report(bench)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 17
    row = next(r for r in rows if r["name"] == "sokoban--ppo--ragen2-main--s1")
    assert row["status"] == "done" and float(row["final_val_success"]) == pytest.approx(0.4)
    assert float(row["best_val_success"]) == pytest.approx(0.4)
    assert float(row["final_val_reward"]) == pytest.approx(0.3)
    assert float(row["final_val_pass_at_g"]) == 0.75
    assert float(row["train_reward_mean"]) == pytest.approx((0.2 + 0.4) / 2)
    assert int(row["steps_skipped"]) == 1 and int(row["steps"]) == 2
    assert float(row["wall_s"]) == 31.0  # the runner's clock, not the last session's 11 s
    assert float(row["kept_fraction_mean"]) == 0.75 and float(row["last_mi_zscore_ema"]) == 0.6
    assert next(r for r in rows if r["name"] == "sokoban--grpo--none--s0")["last_mi_zscore_ema"] == ""  # not logged
    assert int(row["rollout_tokens"]) == 220 and int(row["response_tokens"]) == 5 * 4 + 6 * 4
    failed = next(r for r in rows if r["name"] == "sokoban--dapo--none--s0")
    assert failed["status"] == "failed" and failed["reason"] == "RuntimeError: CUDA out of memory"
    assert failed["final_val_success"] == ""


def test_validation_before_training_and_phase_times_come_from_the_run_directory(bench):
    name = "sokoban--ppo--ragen2-main--s1"
    run = bench / "runs" / name
    (run / "bench_val_before.json").write_text(json.dumps({"val/success_rate": 0.125, "val/reward_mean": -0.05}))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, (rollout, old, update) in zip(rows, [(4.0, 1.0, 10.0), (5.0, 2.0, 20.0)]):
        row.update({"time/rollout_s": rollout, "time/old_log_probs_s": old, "time/update_s": update,
                    "time/filter_s": 0.5})  # the filter runs on every group: not update time
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = build_report(bench)
    row = next(r for r in csv.DictReader(paths["csv"].open()) if r["name"] == name)
    assert float(row["val_success_before"]) == 0.125
    assert float(row["rollout_s"]) == 9.0 and float(row["update_s"]) == 33.0
    other = next(r for r in csv.DictReader(paths["csv"].open()) if r["name"] == "sokoban--ppo--none--s1")
    assert other["val_success_before"] == other["update_s"] == ""  # not measured: blank, not 0
    assert f"| {name} | done | 0.125 | 0.400 |" in paths["markdown"].read_text()
    from ragen2.bench.plots import cell_rows

    assert cell_rows(run)[0] == {"step": -1, "val/success_rate": 0.125}  # drawn at step 0 of the curve


def test_json_aggregates_mean_and_sample_std_over_seeds(bench):
    data = json.loads(build_report(bench, with_plots=False)["json"].read_text())
    group = next(g for g in data["aggregated"] if (g["env"], g["row"], g["treatment"]) == ("sokoban", "ppo", "none"))
    assert group["final_val_success"]["mean"] == pytest.approx(0.15)
    assert group["final_val_success"]["std"] == pytest.approx(math.sqrt(2 * 0.05 ** 2))
    assert group["final_val_success"]["n"] == 2 and group["seeds"] == [0, 1]
    assert group["wall_s"]["mean"] == 30.5
    assert len(data["aggregated"]) == 8  # the failed dapo cell has no group


def test_markdown_table_is_paper_shaped_with_deltas_and_published_numbers(bench):
    text = build_report(bench, with_plots=False)["markdown"].read_text()
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| algorithm"))
    assert header == ("| algorithm | sokoban: none | sokoban: ragen2-main | countdown: none | countdown: ragen2-main |")
    ppo = next(line for line in lines if line.startswith("| ppo |"))
    # sokoban: 0.10/0.20 → 15.0 ± 7.1; 0.30/0.40 → 35.0 ± 7.1, +20.0 points; countdown 55.0 → 50.0 (−5.0)
    assert ppo == "| ppo | 15.0 ± 7.1 | 35.0 ± 7.1 (+20.0) | 55.0 ± 7.1 | 50.0 ± 7.1 (-5.0) |"
    grpo = next(line for line in lines if line.startswith("| grpo |"))
    assert grpo == "| grpo | 25.0 ± 7.1 | 25.0 ± 7.1 (+0.0) | 65.0 ± 7.1 | 75.0 ± 7.1 (+10.0) |"
    published = next(line for line in lines if line.startswith("| ppo, published |"))
    assert published == "| ppo, published | 12.9 | 28.9 (+16.0) | 97.9 | 97.9 (+0.0) |"
    assert not any(line.startswith("| grpo, published") for line in lines)  # the paper gives no such row: none shown
    assert "| dapo |" in text and "| dapo | — | — | — | — |" in text  # its only cell failed
    assert "- `sokoban--dapo--none--s0`: failed — RuntimeError: CUDA out of memory" in text
    assert "16 of 17 cells finished" in text


def test_paired_differences_budgets_and_warnings_where_declared_budgets_differ(bench, capsys):
    manifest = json.loads((bench / "bench.json").read_text())
    manifest["suite_data"] = {"equal_budgets": ["env_episodes", "optimizer_steps"]}
    (bench / "bench.json").write_text(json.dumps(manifest))
    assert main(["bench", "report", str(bench), "--no-plots"]) == 0
    err = capsys.readouterr().err
    row = next(r for r in csv.DictReader((bench / "results.csv").open()) if r["name"] == "sokoban--ppo--ragen2-main--s1")
    assert (float(row["env_episodes"]), float(row["update_tokens"]), float(row["optimizer_steps"])) == (8, 100, 1)
    assert float(row["optimizer_steps_per_trained_step"]) == 1.0  # 1 step over 1 trained step (1 skipped)
    text = (bench / "report.md").read_text()
    # ppo on sokoban: 0.30 − 0.10 and 0.40 − 0.20 → +20 points on both seeds; sd 0; sign flips
    # (+,+) (−,−) (+,−) (−,+): |mean| >= 0.2 in 2 of 4 → p = 0.5
    assert "| sokoban | ppo | ragen2-main − none | 2 | +20.0 | [+20.0, +20.0] | [+20.0, +20.0] | 0.5 |" in text
    # countdown grpo: 0.70 − 0.60, 0.80 − 0.70
    assert "| countdown | grpo | ragen2-main − none | 2 | +10.0 |" in text
    # the filter arm skipped its second step: 1 optimiser step against 2, on both seeds, in all 4 rows
    warning = ("main / sokoban / ppo: `ragen2-main` vs `none` differ in optimizer_steps, which the suite declares "
               "equal (seed 0: 2 vs 1, seed 1: 2 vs 1)")
    assert f"- **Warning**: {warning}" in text and text.count("- **Warning**") == 4
    assert f"warning: {warning}" in err and "env_episodes" not in err.replace("env_episodes, optimizer_steps", "")
    assert "| sokoban--ppo--none--s1 | 8 | 44 | 2 | 220 | 2 | 2 | 1 |" in text  # the budget table (2 rounds: one a step)
    data = json.loads((bench / "results.json").read_text())
    assert data["equal_budgets"] == ["env_episodes", "optimizer_steps"] and len(data["budget_warnings"]) == 4
    assert len(data["comparisons"]) == 4 and all(c["n"] == 2 for c in data["comparisons"])


def test_plots_one_png_per_env_and_the_cli(bench, capsys):
    assert main(["bench", "report", str(bench)]) == 0
    assert "2 plot(s)" in capsys.readouterr().out
    for env in ("sokoban", "countdown"):
        png = bench / "plots" / f"{env}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![sokoban](plots/sokoban.png)" in (bench / "report.md").read_text()
    assert main(["bench", "report", str(bench / "nowhere")]) == 2
    assert "no bench.json here" in capsys.readouterr().err


def test_mean_std_and_percent_edge_cases():
    assert mean_std([]) == {"mean": None, "std": None, "n": 0}
    one = mean_std([0.25, None])
    assert one == {"mean": 0.25, "std": None, "n": 1} and percent(one) == "25.0 ± –"
    assert percent(mean_std([0.0, 1.0])) == f"50.0 ± {100 * math.sqrt(0.5):.1f}"


def test_docs_copy_keeps_the_hand_written_reading(bench, tmp_path, capsys):
    docs = tmp_path / "docs" / "bench_x.md"
    assert main(["bench", "report", str(bench), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.startswith("# Bench `main-table`") and "![sokoban](bench_x_sokoban.png)" in text
    assert "\n### main\n" in text and "\n## main\n" not in text  # sections nest under the doc's title
    assert (docs.parent / "bench_x_sokoban.png").is_file() and (docs.parent / "bench_x.json").is_file()
    docs.write_text(text.replace("(to be written after looking at the numbers)", "It learned."))
    assert main(["bench", "report", str(bench), "--docs", str(docs), "--no-plots"]) == 0
    again = docs.read_text()
    assert "It learned." in again and again.count("| ppo, published |") == 1


def test_the_plot_legend_sits_below_the_panels_not_over_the_curves(bench, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ragen2.bench import plots

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep each figure to inspect it
    manifest = json.loads((bench / "bench.json").read_text())
    results = [{"name": c["name"], "status": "done"} for c in manifest["cells"]]
    plots.plot_envs(bench / "legend-check", manifest["cells"], results)
    assert figures
    for figure in figures:
        assert all(axis.get_legend() is None for axis in figure.axes)
        (legend,) = figure.legends
        labels = [text.get_text() for text in legend.get_texts()]
        assert labels and len(labels) == len(set(labels))  # each line once, for all panels
        assert legend.get_window_extent().y1 <= min(a.get_window_extent().y0 for a in figure.axes if a.lines) + 1


def test_replace_block_rewrites_only_between_its_markers():
    text = "intro\nB\nold figures\nE\nafter, kept\n"
    assert replace_block(text, "  new figures\n", "B", "E") == "intro\nB\nnew figures\nE\nafter, kept\n"
    assert replace_block("no markers here\n", "new", "B", "E") is None
    assert replace_block("B but no end\n", "new", "B", "E") is None


def test_arms_that_sampled_different_budgets_are_also_compared_at_equal_episodes(bench):
    """An arm that sampled two rounds a step (dynamic sampling) is judged at its final validation after
    the same number of steps, and again at the episodes the other arm sampled in all."""
    for seed in (0, 1):
        run = bench / "runs" / f"sokoban--ppo--ragen2-main--s{seed}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row.update({"sampling/rounds": 2.0, "sampling/episodes": 8.0, "sampling/tokens": 60.0})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "bench_val_before.json").write_text(json.dumps({"val/success_rate": 0.05}))  # seed 1's: at 0 episodes
    paths = build_report(bench, with_plots=False)
    text = paths["markdown"].read_text()
    data = json.loads(paths["json"].read_text())
    cell = next(c for c in data["cells"] if c["name"] == "sokoban--ppo--ragen2-main--s1")
    assert (cell["env_episodes"], cell["generation_rounds"], cell["response_tokens"]) == (16.0, 4.0, 120)
    assert cell["val_curve"] == [[0.0, 0.05], [8.0, 0.2], [16.0, 0.4]]
    steps, episodes = text.split("at an equal rollout budget")
    assert "at an equal number of training steps" in steps
    # equal steps: 0.30 − 0.10, 0.40 − 0.20 as before
    assert "| sokoban | ppo | ragen2-main − none | 2 | +20.0 |" in steps
    # equal episodes (8 each): ragen2-main at its step 0 (0.15, 0.20) against none at its end (0.10, 0.20)
    (matched,) = [c for c in data["comparisons"] if c["basis"] == "equal_episodes"]
    assert matched["episodes"] == {"0": 8.0, "1": 8.0} and matched["differences"] == pytest.approx([0.05, 0.0])
    assert "| sokoban | ppo | ragen2-main − none | 2 | +2.5 |" in episodes
    assert "| countdown |" not in episodes.split("## Every cell")[0]  # equal budgets there: one basis


def test_each_arms_gain_over_the_start_is_paired_over_seeds_with_its_rate_per_cell_hour(bench):
    # the untrained model validated at 0.05 (seed 0) and 0.15 (seed 1) in the ppo/sokoban cells
    for seed, before in ((0, 0.05), (1, 0.15)):
        for arm in ("none", "ragen2-main"):
            run = bench / "runs" / f"sokoban--ppo--{arm}--s{seed}"
            (run / "bench_val_before.json").write_text(json.dumps({"val/success_rate": before}))
    paths = build_report(bench, with_plots=False)
    gains = json.loads(paths["json"].read_text())["gains_over_start"]
    assert [(g["env"], g["row"], g["arm"]) for g in gains] == [("sokoban", "ppo", "none"),
                                                              ("sokoban", "ppo", "ragen2-main")]
    none, main_filter = gains
    # final: none 0.10 / 0.20, ragen2-main 0.30 / 0.40; so gains 0.05 twice and 0.25 twice
    assert none["n"] == 2 and none["mean"] == pytest.approx(0.05) and none["before_mean"] == pytest.approx(0.10)
    assert main_filter["mean"] == pytest.approx(0.25) and main_filter["after_mean"] == pytest.approx(0.35)
    hours = (30.0 + 31.0) / 2 / 3600  # the cells' wall times: 30 s and 31 s
    assert none["cell_hours_mean"] == pytest.approx(hours)
    assert none["gain_per_cell_hour"] == pytest.approx(0.05 / hours)
    report = paths["markdown"].read_text()
    assert "Gain over the start" in report and "| sokoban | ppo | ragen2-main | 2 | 10.0 | 35.0 | +25.0 |" in report


def test_the_gain_per_hour_counts_a_cells_own_steps_not_attempts_lost_to_a_kill(bench):
    # a cell killed and resumed: the runner's clock spans both attempts, its steps ran once each
    for seed, before in ((0, 0.05), (1, 0.15)):
        for arm in ("none", "ragen2-main"):
            run = bench / "runs" / f"sokoban--ppo--{arm}--s{seed}"
            (run / "bench_val_before.json").write_text(json.dumps({"val/success_rate": before}))
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row in rows:
                row["time/step_s"] = 600.0
            rows[-1]["time/validation_s"] = 300.0
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            state = json.loads((run / "bench_cell.json").read_text())
            (run / "bench_cell.json").write_text(json.dumps({**state, "wall_s": 99999.0}))
    paths = build_report(bench, with_plots=False)
    none = json.loads(paths["json"].read_text())["gains_over_start"][0]
    steps = len((bench / "runs" / "sokoban--ppo--none--s0" / "metrics.jsonl").read_text().splitlines())
    hours = (600.0 * steps + 300.0) / 3600
    assert none["cell_hours_mean"] == pytest.approx(hours)
    assert none["gain_per_cell_hour"] == pytest.approx(none["mean"] / hours)
    # the per-cell table too shows the cell's own compute, not the runner's 99999 s
    cells = paths["markdown"].read_text().split("## Every cell")[1]
    row = next(line for line in cells.splitlines() if line.startswith("| sokoban--ppo--none--s0 |"))
    assert f"| {(600.0 * steps + 300.0) / 60:.1f} |" in row and f"{99999.0 / 60:.1f}" not in row


def test_no_change_from_the_baseline_is_shown_while_the_arms_cover_different_seeds(bench):
    """A suite reported part-way: the baseline has finished seeds 0 and 1, a treatment seed 0 only.
    The difference of those means mixes the seeds' difference into the treatment's, so the table
    shows each mean and no change until both cover the same seeds."""
    unfinished = bench / "runs" / "sokoban--ppo--ragen2-main--s1"
    (unfinished / "summary.json").unlink()
    (unfinished / "bench_cell.json").write_text(json.dumps({"status": "running"}))
    lines = build_report(bench, with_plots=False)["markdown"].read_text().splitlines()
    ppo = next(line for line in lines if line.startswith("| ppo |"))
    # sokoban: none over seeds 0, 1 (15.0 ± 7.1), ragen2-main over seed 0 (30.0): no change shown;
    # countdown: both arms over seeds 0, 1, so its change stays
    assert ppo == "| ppo | 15.0 ± 7.1 | 30.0 ± – | 55.0 ± 7.1 | 50.0 ± 7.1 (-5.0) |"
