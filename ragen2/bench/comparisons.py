"""The report's paired comparisons of arms and its budget checks.

Arms are the treatments of one table row in one env of one matrix (e.g. the filters none,
starpo-s, snr-top-p under one algorithm): every pair of them is compared on the seeds both
finished (ragen2.bench.stats). Each cell's budget, what it actually spent, is read from its
metrics rows by report.cell_result; a suite may declare budgets its arms must spend equally
(`equal_budgets: [env_episodes, optimizer_steps_per_trained_step]`), and a pair whose cells of
one seed differ in one of them gets a warning: the comparison is then confounded by it.

Each comparison says its basis. equal_steps: each arm's final validation after the suite's number of
training steps (an update each, unless a filter skipped it). Where two arms sampled different
numbers of episodes (DAPO's dynamic sampling samples extra rounds), also equal_episodes: per seed,
each arm's last validation within the episodes the cheaper arm sampled in all, so the arm that
sampled more is judged at the rollout budget the other spent.
"""

from __future__ import annotations

import itertools
import math

from ragen2.bench.stats import paired_comparison

# budget name -> its column in results (report.COLUMNS)
BUDGETS = {
    "env_episodes": "env_episodes",  # training episodes rolled out (validation not counted)
    "sampled_tokens": "response_tokens",  # tokens the policy sampled in training rollouts
    "generation_rounds": "generation_rounds",  # rollouts of num_groups groups (> steps: dynamic sampling)
    "update_tokens": "update_tokens",  # tokens through the update's forward/backward, every epoch
    "optimizer_steps": "optimizer_steps",
    "trained_steps": "steps_trained",  # steps not skipped by the filter
    "optimizer_steps_per_trained_step": "optimizer_steps_per_trained_step",
}
COMPARED = "final_val_success"
AT_EQUAL_EPISODES = "val_success_at_equal_episodes"
BASES = {"equal_steps": "at an equal number of training steps (each arm's final validation; a skipped step "
                        "makes no update)",
         "equal_episodes": "at an equal rollout budget (per seed, each arm's last validation within the "
                           "training episodes the cheaper arm sampled; `trainer.val_every` sets how close)"}


def arms_in_order(cells: list[dict], matrix: str) -> list[str]:
    """The matrix's treatments, baseline first, then in the suite's order."""
    mine = [c for c in cells if c["matrix"] == matrix]
    treatments = list(dict.fromkeys(c["treatment"] for c in mine))
    baseline = mine[0]["baseline"]
    return [baseline] + [t for t in treatments if t != baseline] if baseline in treatments else treatments


def _same(x, y) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


def budget_differences(a: dict[int, dict], b: dict[int, dict], budgets: list[str]) -> list[dict]:
    """Per declared budget, the seeds on which the two arms' cells differ (or one did not record it)."""
    out = []
    for budget in budgets:
        column = BUDGETS[budget]
        unequal = [(seed, a[seed][column], b[seed][column]) for seed in sorted(a.keys() & b.keys())
                   if a[seed][column] is None or b[seed][column] is None
                   or not _same(a[seed][column], b[seed][column])]
        if unequal:
            out.append({"budget": budget, "seeds": [s for s, _, _ in unequal],
                        "values": [[x, y] for _, x, y in unequal]})
    return out


def at_episodes(curve: list, budget: float) -> float | None:
    """Validation success at the last validated step within `budget` training episodes."""
    within = [success for episodes, success in curve or () if episodes <= budget + 1e-9]
    return within[-1] if within else None


def equal_episode_values(a: dict[int, dict], b: dict[int, dict]) -> tuple[dict, dict, dict] | None:
    """Per seed, both arms' success at the episodes the cheaper one sampled, and that budget; None
    when the arms sampled equal episodes on every seed (the equal-steps comparison is then the one)."""
    seeds = sorted(s for s in a.keys() & b.keys() if a[s]["env_episodes"] is not None and b[s]["env_episodes"] is not None)
    if all(_same(a[s]["env_episodes"], b[s]["env_episodes"]) for s in seeds):
        return None
    budget = {s: min(a[s]["env_episodes"], b[s]["env_episodes"]) for s in seeds}
    values = [{s: v for s in seeds if (v := at_episodes(arm[s].get("val_curve"), budget[s])) is not None}
              for arm in (a, b)]
    return values[0], values[1], budget


def arm_groups(cells: list[dict], results: list[dict]):
    """Each table row of each env of each matrix: (matrix, env, row, its arms in order, and per arm
    {seed: result} of the cells that finished)."""
    done = {r["name"]: r for r in results if r["status"] == "done"}
    for matrix in dict.fromkeys(c["matrix"] for c in cells):
        arms = arms_in_order(cells, matrix)
        mine = [c for c in cells if c["matrix"] == matrix]
        for env, row in dict.fromkeys((c["env"], c["row"]) for c in mine):
            here = [c for c in mine if (c["env"], c["row"]) == (env, row)]
            present = [arm for arm in arms if any(c["treatment"] == arm for c in here)]
            by_arm = {arm: {c["seed"]: done[c["name"]] for c in here if c["treatment"] == arm and c["name"] in done}
                      for arm in present}
            yield matrix, env, row, present, by_arm


def compare(cells: list[dict], results: list[dict], equal_budgets: list[str] = (),
            metric: str = COMPARED) -> list[dict]:
    """Every pair of arms within (matrix, env, row): `metric` of arm b − arm a over paired seeds,
    and the declared budgets they spent unequally."""
    comparisons = []
    for matrix, env, row, present, by_arm in arm_groups(cells, results):
        for a, b in itertools.combinations(present, 2):
            stats = paired_comparison({s: r[metric] for s, r in by_arm[a].items()},
                                      {s: r[metric] for s, r in by_arm[b].items()})
            comparisons.append({"matrix": matrix, "env": env, "row": row, "a": a, "b": b, "metric": metric,
                                "basis": "equal_steps", **stats,
                                "budget_differences": budget_differences(by_arm[a], by_arm[b],
                                                                         list(equal_budgets))})
            matched = equal_episode_values(by_arm[a], by_arm[b]) if metric == COMPARED else None
            if matched is not None:  # the budgets differ by design here: no budget warnings
                comparisons.append({"matrix": matrix, "env": env, "row": row, "a": a, "b": b,
                                    "metric": AT_EQUAL_EPISODES, "basis": "equal_episodes",
                                    **paired_comparison(matched[0], matched[1]), "episodes": matched[2],
                                    "budget_differences": []})
    return comparisons


def gains_over_start(cells: list[dict], results: list[dict]) -> list[dict]:
    """Per arm: final validation success − validation of the untrained (or warm-started) model on the
    same instances (the suite's validate_before), paired over the seeds that have both, and that gain
    per hour of the cells' own compute (their steps' and validations' logged times, so attempts lost
    to a kill are not counted; the runner's wall time where a cell logged none). A cell run with
    one torch thread keeps about one core busy."""
    gains = []
    for matrix, env, row, present, by_arm in arm_groups(cells, results):
        for arm in present:
            rows = {s: r for s, r in by_arm[arm].items()
                    if r["val_success_before"] is not None and r["final_val_success"] is not None}
            if not rows:
                continue
            before = {s: r["val_success_before"] for s, r in rows.items()}
            after = {s: r["final_val_success"] for s, r in rows.items()}
            stats = paired_comparison(before, after)
            seconds = [r.get("compute_s") or r["wall_s"] for r in rows.values()]
            hours = [x / 3600 for x in seconds if x]
            mean_hours = sum(hours) / len(hours) if hours else None
            gains.append({"matrix": matrix, "env": env, "row": row, "arm": arm, **stats,
                          "before_mean": sum(before.values()) / len(rows), "after_mean": sum(after.values()) / len(rows),
                          "cell_hours_mean": mean_hours,
                          "gain_per_cell_hour": (stats["mean"] / mean_hours if mean_hours else None)})
    return gains


def gain_lines(matrix: str, gains: list[dict]) -> list[str]:
    """The markdown table of each arm's gain over the start (points of success rate)."""
    mine = [g for g in gains if g["matrix"] == matrix]
    if not mine:
        return []
    lines = ["Gain over the start: each arm's final validation success − its validation before training "
             "(the same instances), points, paired over the seeds with both; 95% CIs; exact sign-flip p, "
             "two-sided; per hour of a cell's own compute (its steps and validations; attempts lost to a kill "
             "excluded):", "",
             "| env | row | arm | n | before | after | gain | t CI | sign-flip p | cell hours | gain per hour |",
             "|" + " --- |" * 11]
    for g in mine:
        p = "—" if g["sign_flip_p"] is None else f"{g['sign_flip_p']:.3g}" + ("" if g["p_exact"] else " (MC)")
        hours = "—" if g["cell_hours_mean"] is None else f"{g['cell_hours_mean']:.2f}"
        lines.append(f"| {g['env']} | {g['row']} | {g['arm']} | {g['n']} | {100 * g['before_mean']:.1f} | "
                     f"{100 * g['after_mean']:.1f} | {_points(g['mean'])} | {_interval(g['t_ci'])} | {p} | {hours} | "
                     f"{_points(g['gain_per_cell_hour'])} |")
    return lines + [""]


def warnings(comparisons: list[dict]) -> list[str]:
    lines = []
    for c in comparisons:
        for d in c["budget_differences"]:
            values = ", ".join(f"seed {s}: {_fmt(x)} vs {_fmt(y)}" for s, (x, y) in zip(d["seeds"], d["values"]))
            lines.append(f"{c['matrix']} / {c['env']} / {c['row']}: `{c['b']}` vs `{c['a']}` differ in "
                         f"{d['budget']}, which the suite declares equal ({values})")
    return lines


def _fmt(value) -> str:
    if value is None:
        return "not recorded"
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else f"{int(value)}"


def _points(value) -> str:
    return "—" if value is None else f"{100 * value:+.1f}"


def _interval(ci) -> str:
    return "—" if ci is None else f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def comparison_lines(matrix: str, comparisons: list[dict]) -> list[str]:
    """The markdown table of one matrix's paired differences, in points of success rate."""
    lines = []
    for basis, said in BASES.items():
        mine = [c for c in comparisons if c["matrix"] == matrix and c.get("basis", "equal_steps") == basis]
        if not mine:
            continue
        label = {COMPARED: "validation success", AT_EQUAL_EPISODES: "validation success"}.get(
            mine[0]["metric"], mine[0]["metric"])
        lines += [f"Paired differences of {label} {said}. B − A, points; over the seeds "
                  "both arms finished; 95% CIs; exact sign-flip p, two-sided:", "",
                  "| env | row | B − A | n | mean | t CI | bootstrap CI | sign-flip p |", "|" + " --- |" * 8]
        for c in mine:
            p = "—" if c["sign_flip_p"] is None else f"{c['sign_flip_p']:.3g}" + ("" if c["p_exact"] else " (MC)")
            lines.append(f"| {c['env']} | {c['row']} | {c['b']} − {c['a']} | {c['n']} | {_points(c['mean'])} | "
                         f"{_interval(c['t_ci'])} | {_interval(c['bootstrap_ci'])} | {p} |")
        lines.append("")
    return lines


def budget_lines(results: list[dict], equal_budgets: list[str], warning_lines: list[str]) -> list[str]:
    """The budget each cell spent, then the warnings (or that the declared budgets were equal)."""
    names = list(BUDGETS)
    lines = ["## Budget spent", "", "Training only (validation is the same in every arm). "
             "Sampled tokens: the policy's rollout tokens; update tokens: prompt and response tokens through "
             "the update, every epoch.", "",
             "| cell | " + " | ".join(n.replace("_", " ") for n in names) + " |", "|" + " --- |" * (len(names) + 1)]
    for r in results:
        if r["status"] == "done":
            lines.append(f"| {r['name']} | " + " | ".join(_fmt(r[BUDGETS[n]]) for n in names) + " |")
    if equal_budgets:
        lines += ["", f"Declared equal across arms: {', '.join(equal_budgets)}.", ""]
        lines += [f"- **Warning**: {w}" for w in warning_lines] or ["No compared arms differ in them."]
    return lines
