#!/bin/bash
# The README's test suite in a shuffled order, once per seed given (issue 32 item 8: a test that
# passes alone must pass in any order). Each run uses a detached worktree of HEAD, so edits made
# meanwhile cannot reach it, and pytest-randomly from a folder of its own, so the project's venv
# (and CI's fixed order) stays as it is. Run from the repository root with the venv active:
#   scripts/shuffled_tests.sh 1 2 3        # one line per run in /tmp/ragen2-shuffled/summary.txt
#   SUMMARY=docs/benchmarks/shuffled_tests_intel_mkl_path.txt scripts/intel_mkl_path.sh scripts/shuffled_tests.sh 1 2 3
#   scripts/without_bf16.sh scripts/shuffled_tests.sh 1 2 3   # as on a CPU without bf16 units
# Each line names the CPU, the MKL code path the run took (Intel's AVX-512 one under
# scripts/intel_mkl_path.sh, as on the Intel machines) and what `model.dtype=auto` chose there,
# and is appended to $SUMMARY as well.
set -u
root=$(git rev-parse --show-toplevel) || exit 1
work=/tmp/ragen2-shuffled
plugin=$work/plugin
mkdir -p "$work"
[ -d "$plugin/pytest_randomly" ] || pip install -q --no-deps --target "$plugin" pytest-randomly==5.1.0 || exit 1
summary=${SUMMARY:-}
case "${LD_PRELOAD:-}" in
  *ragen2-intel-mkl*) mkl_path="MKL on its Intel AVX-512 path (scripts/intel_mkl_path.sh)" ;;
  *) mkl_path="MKL on this CPU's own path" ;;
esac
auto_dtype=$(python -c "from ragen2 import precision; print(precision.resolve('auto').dtype)") || exit 1
for seed in "$@"; do
  tree=$work/tree-$seed
  git -C "$root" worktree prune
  [ -d "$tree" ] && git -C "$root" worktree remove --force "$tree"
  git -C "$root" worktree add -q --detach "$tree" HEAD || exit 1
  start=$(date +%s)
  (cd "$tree" && PYTHONSAFEPATH=1 PYTHONPATH="$tree:$plugin${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -p randomly \
     --randomly-seed="$seed" -o addopts="" -q -p no:cacheprovider) > "$work/seed-$seed.log" 2>&1
  rc=$?
  echo "seed $seed commit $(git -C "$tree" rev-parse --short HEAD) rc $rc wall $(( $(date +%s) - start )) s" \
       "load $(cut -d' ' -f1-3 /proc/loadavg) cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" \
       "| $mkl_path | auto dtype $auto_dtype | $(tail -n 1 "$work/seed-$seed.log")" | tee -a "$work/summary.txt" ${summary:+"$root/$summary"}
  git -C "$root" worktree remove --force "$tree"
done
