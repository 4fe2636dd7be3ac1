"""Rewrite docs/evidence.md's claim-3 parts (status row, state, table, reading) from
docs/benchmarks/grad_vs_spread.json, after `python scripts/grad_vs_spread.py`:

    python scripts/claim3_evidence_doc.py ["2026-12-04 (14:52 UTC)"]

The history of earlier estimates is written as it stands; add a line there when a reading is
superseded (the JSON keeps only the latest).
"""
import datetime
import json
import pathlib
import re
import sys

import yaml

root = pathlib.Path(__file__).resolve().parents[1]
d = json.loads((root / "docs/benchmarks/grad_vs_spread.json").read_text())
dr, gr = d["by_algo"]["ragen2-dr-grpo"], d["by_algo"]["ragen2-grpo"]
cells = d["finished_cells"]
seeds_dr, seeds_gr = dr["seeds"], gr["seeds"]
assert seeds_dr == list(range(len(seeds_dr))), seeds_dr
n = min(len(seeds_dr), len(seeds_gr))
suite = yaml.safe_load((root / "ragen2/configs/bench/grad-vs-spread.yaml").read_text())
total = len(suite["seeds"]) * sum(len(m["algos"]) for m in suite["matrices"])


def f2(x):
    return f"{x:.2f}"


def ci(s):
    return f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def width(s):
    return s["ci95"][1] - s["ci95"][0]


analysed = set(seeds_dr) | set(seeds_gr)
cpu_of_seed = {}  # the CPU each analysed seed's cells ran on (from the runner's bench_cell.json)
for cell in sorted((root / "docs/experiments/grad-vs-spread/runs").glob("*/bench_cell.json")):
    seed = int(cell.parent.name.rsplit("--s", 1)[1])
    if seed in analysed:
        cpu_of_seed[seed] = json.loads(cell.read_text())["cpu"].strip()
intel = sorted(s for s, cpu in cpu_of_seed.items() if "Intel" in cpu)
amd = sorted(s for s, cpu in cpu_of_seed.items() if "AMD" in cpu)
now = sys.argv[1] if len(sys.argv) > 1 else datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d (%H:%M UTC)")
seeds_text = f"seeds 0-{n-1}" if len(seeds_dr) == len(seeds_gr) else f"seeds 0-{len(seeds_dr)-1} of Dr.GRPO and 0-{len(seeds_gr)-1} of GRPO"
cpu_text = (f"Seeds {amd[0]}-{amd[-1]} ran on an AMD EPYC and seeds {intel[0]}-{intel[-1]} on an Intel Xeon, "
            "all in fp32 (`model.dtype=float32` in the suite), so the machines differ only in rounding") if intel else ""
w_dr, w_gr = width(dr["task_norm"]), width(gr["task_norm"])
if cells >= total:
    state = (f"Finished on {now}: both widths went under 0.6 at seeds 0-{n-1}, so the suite stopped there "
             f"(all {total} cells); the table is what {n} seeds show.")
else:
    state = (f"State on {now}: {cells} of {total} cells finished, {seeds_text}; two runners (one core each, "
             f"sharing the cells) continue, and the table is what {n} seeds show.")
text = (root / "docs/evidence.md").read_text()

# status row
row = re.compile(r"\| \(3\) task-gradient norm grows.*\n")
status = (f"| (3) task-gradient norm grows with reward spread, regularisers flat | **not shown at CPU scale** (suite "
          f"`grad-vs-spread`, {cells} of {total} cells, {seeds_text}{'' if cells >= total else '; more running'}): under Dr.GRPO the slope is "
          f"+{f2(dr['task_norm']['slope'])}, CI {ci(dr['task_norm'])}: the interval is as narrow as asked (width "
          f"{w_dr:.3f}, within ±0.3; GRPO's is {w_gr:.2f}{', also within' if w_gr < 0.6 else ''}), spans 0 and excludes the predicted ≈ 1; under "
          f"std-normalised GRPO the norm falls with spread ({f2(gr['task_norm']['slope'])}) where flat is predicted; "
          f"the scaled entropy norms are near flat | [below](#claim-3-gradient-norm-against-reward-spread) |\n")
assert row.search(text)
text = row.sub(lambda m: status, text)

start = text.index("Seeds 0-3 gave a Dr.GRPO interval")
body = f"""Seeds 0-3 gave a Dr.GRPO interval about ±0.6 wide (`grad_vs_spread.json` as of commit 470533a),
seeds 0-7 one 1.07 wide (commit 285d526's file): seeds differ more than the first four showed, so
the suite ran seeds 0-31, about three times the clusters of seeds 0-7 that ±0.3 needs. At 26 seeds
the GRPO interval was still 0.68 wide, and widths shrink as one over the square root of the seeds,
so seeds 32-39 were added, to be read in order until both arms' widths were under 0.6.
{state} {cpu_text}.

<!-- source: docs/benchmarks/grad_vs_spread.json -->
| algorithm | series | slope | 95% CI | groups with spread | (seed, step) clusters |
| --- | --- | --- | --- | --- | --- |
"""
for name, a in (("ragen2-dr-grpo", dr), ("ragen2-grpo", gr)):
    for key, label in (("task_norm", "task norm"), ("task_norm_per_token", "task norm per sampled token"),
                       ("entropy_scaled_norm", "entropy norm x coefficient")):
        s = a[key]
        body += f"| {name} | {label} | {f2(s['slope'])} | {ci(s)} | {s['points']} | {s['clusters']} |\n"
body += f"""
What {n} seeds show: under Dr.GRPO the task norm's slope is {f2(dr['task_norm']['slope'])}, CI {ci(dr['task_norm'])}: the
interval spans 0 and excludes the ≈ 1 RAGEN-2's argument predicts. The estimate kept moving as seeds were
added: 0.14, CI [-0.44, 0.63] over 8 seeds (commit 285d526's file); 0.42, CI [0.05, 0.74] over
13 seeds (commit 6b65539's file), briefly excluding 0; 0.31, CI [-0.09, 0.65] over 15 (commit
cd62ca1's file); 0.32, CI [-0.02, 0.63] over 19 (commit 6a281e7's file); 0.32, CI [0.00,
0.60] over 21 (commit bf314ea's file); 0.26, CI [-0.05, 0.53] over 25 (commit ee5bec9's file);
0.24, CI [-0.04, 0.49] over 29 (commit c3d53d5's); 0.22, CI [-0.05, 0.46] over 33 (commit 94707cd's).
With 21 seeds and more the interval's width is within the ±0.3 the claim needs ({w_dr:.3f} now); its
lower end has moved across 0 three times as seeds were added, so read it as "between about 0 and
{dr['task_norm']['ci95'][1]:.2f}", not as a settled growth. Under GRPO's std-normalised advantages the norm falls with
spread ({f2(gr['task_norm']['slope'])}, CI excluding zero; that interval is {w_gr:.2f} wide, {'wider than' if w_gr >= 0.6 else 'within'} ±0.3) where the argument
predicts flat, plausibly because dividing by a small std inflates the advantages of low-spread
groups. The scaled entropy norms stay small and near flat ({f2(dr['entropy_scaled_norm']['slope'])}, {f2(gr['entropy_scaled_norm']['slope'])}). So claim 3 is not shown
at this scale: the regulariser is flat as predicted, the flatness under GRPO is not seen, and the
growth under Dr.GRPO is at most a fraction of the predicted one (per sampled token the slope is
{f2(dr['task_norm_per_token']['slope'])}, CI {ci(dr['task_norm_per_token'])}: above 0, below 1). One thing these groups suggest to watch: Bandit's reward
std takes few values (0.05, 0.1, ...), and its low-spread groups are mixes of invalid long
replies and short answers, so under Dr.GRPO's token sums a group's norm also follows its reply
lengths; the per-token series is reported beside the raw one for that reason.
"""
text = text[:start] + body
(root / "docs/evidence.md").write_text(text)
print(status)
