#!/usr/bin/env bash
# Run a long bench suite in the background and commit each cell's small files as it finishes, so
# a later session (perhaps on another machine) resumes from what is committed:
#   nohup scripts/bench_background.sh SUITE [--threads 1] > /tmp/SUITE.log 2>&1 &
# Cells live in docs/experiments/SUITE/runs/<cell>/ (the runner skips a cell whose summary.json
# exists, so the committed ones are never rerun); checkpoints stay out of git (.gitignore) and a
# finished cell's are deleted. The report (results, paired CIs) is rebuilt and committed too.
# The cells import a pinned copy of the code (a detached worktree of HEAD at start), so edits made
# in this tree while the suite runs never reach a cell half-written, and every cell of one start
# records the same commit. Restart the script to run later cells on newer code; a seed whose arms
# began on an older commit is finished on that one (its arms are compared with each other, so they
# share a commit: ragen2.bench.runner.commit_to_resume). Start it twice
# (one core each) and the two share the suite's cells: a runner skips a cell another one holds.
set -uo pipefail
cd "$(dirname "$0")/.."
suite=$1; shift
threads=${*:---threads 1}
out=docs/experiments/$suite

pinned=${TMPDIR:-/tmp}/ragen2-bench-code/$suite.$$  # one per start: runners of one suite may run side by side
git worktree prune
code=$(python -c 'import sys
from pathlib import Path
from ragen2.bench import runner
from ragen2.bench.suite import expand, load_suite
print(runner.commit_to_resume(expand(load_suite(sys.argv[1]), Path(sys.argv[2]))) or "HEAD")' "$suite" "$out") || exit 1
git worktree add -q --detach "$pinned" "$code" || exit 1
trap 'git worktree remove --force "$pinned"' EXIT
# ahead of the editable install's finder; PYTHONSAFEPATH keeps `python -m` from putting this tree first
export PYTHONPATH="$pinned${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
echo "cells run the code of $(git -C "$pinned" rev-parse --short HEAD) from $pinned"

commit_finished() {
  for summary in "$out"/runs/*/summary.json; do
    [ -e "$summary" ] || continue
    cell=$(dirname "$summary")
    # the runner writes the cell's final state after the summary: commit once, when it says done
    grep -q '"status": "done"' "$cell/bench_cell.json" 2>/dev/null || continue
    rm -rf "$cell/checkpoints"
    if [ -n "$(git status --porcelain -- "$cell")" ]; then
      git add -- "$cell" || continue
      for attempt in 1 2 3 4 5; do  # other work commits in the same tree: wait out its index lock
        git commit -q -m "$suite: cell $(basename "$cell") finished (config, metrics, summary)" -- "$cell" && break
        sleep 5
      done
    fi
  done
}

ragen2 bench "$suite" --out "$out" $threads --plain --no-plots &
bench=$!
while kill -0 "$bench" 2>/dev/null; do
  commit_finished
  sleep 60
done
wait "$bench"; status=$?
commit_finished
ragen2 bench report "$out" && git add -- "$out" && git commit -q -m "$suite: report over the finished cells" -- "$out"
exit $status
