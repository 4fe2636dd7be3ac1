"""`ragen2 bench SUITE --out DIR` and `ragen2 bench report DIR` (the suite, runner and report
live in ragen2.bench)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from ragen2.bench import claims, runner
from ragen2.bench.display import make_display
from ragen2.bench.suite import SuiteError, expand, key_settings, load_suite
from ragen2.bench.worker import EngineUnavailable, openrlhf_run
from ragen2.commands import COMMANDS
from ragen2.config import ConfigError
from ragen2.run_dir import checkpoints_dir

FAILED_CELL_RETRIES = 2  # more passes over the cells that failed, each resuming from their checkpoints


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help=COMMANDS["bench"],
        description="`ragen2 bench SUITE --out DIR` runs every cell of configs/bench/SUITE.yaml (or a YAML path) "
                    "one after another, skipping finished cells and resuming a half-finished one from its "
                    "checkpoint, then writes the report. Runners started on the same --out share its cells (each runs "
                    "the cells no other live runner holds). `ragen2 bench report DIR` rebuilds results.csv/json, "
                    "report.md and plots/ from the finished cells.")
    parser.add_argument("suite", metavar="SUITE|report", help="suite name or path; or `report`")
    parser.add_argument("report_dir", nargs="?", type=Path, metavar="DIR", help="with `report`: the bench folder")
    parser.add_argument("--out", type=Path, help="bench folder (default runs/bench/SUITE)")
    parser.add_argument("--list", "--dry-run", dest="list_only", action="store_true",
                        help="validate the suite and list its cells with their key settings and status; run nothing")
    parser.add_argument("--engine", choices=("local", "openrlhf"), default="local",
                        help="training engine of every cell (openrlhf needs the extra installed)")
    cluster = parser.add_argument_group("OpenRLHF engine (--engine openrlhf), passed to every cell")
    cluster.add_argument("--nodes", type=int, default=1, help="Ray nodes (default 1)")
    cluster.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    cluster.add_argument("--vllm-tp", type=int, default=1, help="tensor-parallel size of each vLLM engine (default 1)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set_overrides",
                        help="dotted config override applied to every cell (repeatable)")
    parser.add_argument("--threads", type=int, help="torch threads per cell (1 can be faster on a loaded machine)")
    parser.add_argument("--in-process", action="store_true",
                        help="run cells in this process instead of one child process each (no crash isolation)")
    parser.add_argument("--plain", action="store_true", help="plain status lines instead of the live table")
    parser.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    parser.add_argument("--no-plots", action="store_true", help="report without the PNG curves")
    parser.add_argument("--docs", type=Path, metavar="MD",
                        help="also write the report into this markdown file (generated block; the text around it "
                             "is kept), with its plots and results.json beside it")
    parser.set_defaults(run=run)


def run(args) -> int:
    if args.suite == "report":
        return run_report(args)
    if args.report_dir is not None:
        print(f"error: unexpected argument {args.report_dir} (did you mean --out {args.report_dir}?)", file=sys.stderr)
        return 2
    try:
        suite = load_suite(args.suite)
        out = args.out or Path("runs") / "bench" / suite.name
        cells = expand(suite, out, args.set_overrides)
        runner.check_resumable(cells)
    except (SuiteError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.list_only:
        print(f"suite {suite.name} ({suite.path}): {len(cells)} cells -> {out}/runs/")
        for cell in cells:
            done = runner.is_done(cell.run_dir)
            held = None if done else claims.holder(cell.run_dir)
            status = ("done" if done else "running" if held else
                      "resume" if checkpoints_dir(cell.run_dir).is_dir() else "new")
            where = f" (run by {claims.describe(held)})" if held else ""
            print(f"  [{status:7}] {cell.name}{where}\n            {key_settings(cell)}")
        return 0
    if args.engine == "openrlhf":
        if suite.validate_before:
            print(f"error: {suite.path}: validate_before runs on the local engine only (the OpenRLHF engine "
                  "validates inside its own trainer); drop it or --engine", file=sys.stderr)
            return 2
        try:
            openrlhf_run()
        except EngineUnavailable as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    runner.write_manifest(out, suite, cells, args.engine)
    run_one = runner.in_process_cell if args.in_process else runner.subprocess_cell
    cluster = ({"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "vllm_tp": args.vllm_tp}
               if args.engine == "openrlhf" else None)
    run_one = functools.partial(run_one, engine=args.engine, threads=args.threads, cluster=cluster,
                                validate_before=suite.validate_before)
    print(f"bench {suite.name}: {len(cells)} cells in {out}/runs (logs: <cell>/{runner.CELL_LOG})", file=sys.stderr)
    with make_display([c.name for c in cells], f"ragen2 bench {suite.name}",
                      live=False if args.plain else None) as display:
        statuses = runner.run_cells(cells, run_one, display, suite.keep_final_checkpoint)
        for _ in range(FAILED_CELL_RETRIES):  # from the cell's newest checkpoint: a kill for memory need not recur
            again = {name for name, status in statuses.items() if status == "failed"}
            if not again:
                break
            print(f"retrying {len(again)} failed cell(s) from their checkpoints", file=sys.stderr)
            statuses.update(runner.run_cells(cells, run_one, display, suite.keep_final_checkpoint, only=again))
    failed = [name for name, status in statuses.items() if status == "failed"]
    elsewhere = [name for name, status in statuses.items() if status == "elsewhere"]
    if not args.no_report:
        from ragen2.bench.report import build_report, publish  # matplotlib: not for --help or --list

        paths = build_report(out, with_plots=not args.no_plots)
        print(f"report: {paths['markdown']} (+ results.csv, results.json, {len(paths['plots'])} plots)")
        _print_warnings(paths)
        if args.docs:
            print(f"wrote {publish(args.docs, paths)}")
    if elsewhere:
        print(f"{len(elsewhere)} cell(s) left to the other runner(s) on this folder: {', '.join(elsewhere)}; "
              "the last runner to finish writes the complete report", file=sys.stderr)
    other_commit = [name for name, status in statuses.items() if status == "other-commit"]
    if other_commit:
        print(f"{len(other_commit)} cell(s) not run: their seed's other arms ran on another commit "
              f"({', '.join(other_commit)}); scripts/bench_background.sh runs them there", file=sys.stderr)
    if failed:
        print(f"{len(failed)} cell(s) failed: {', '.join(failed)}; reasons in {out}/report.md; "
              f"run the same command again to retry them", file=sys.stderr)
        return 1
    return 0


def run_report(args) -> int:
    if args.report_dir is None:
        print("error: usage: ragen2 bench report DIR", file=sys.stderr)
        return 2
    from ragen2.bench.report import build_report, publish  # as in run

    try:
        paths = build_report(args.report_dir, with_plots=not args.no_plots)
    except SuiteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {paths['markdown']}, {paths['csv']}, {paths['json']} and {len(paths['plots'])} plot(s)")
    _print_warnings(paths)
    if args.docs:
        print(f"wrote {publish(args.docs, paths)}")
    return 0


def _print_warnings(paths: dict) -> None:
    """Arms that spent a declared-equal budget unequally: their comparison is confounded by it."""
    for line in paths["warnings"]:
        print(f"warning: {line}", file=sys.stderr)
