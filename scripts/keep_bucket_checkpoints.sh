#!/bin/bash
# Keep (hard links: no copy) the policy of steps 5 and 10 of the `none` arm, seeds 0-2, of the
# multi-turn suite before its runner deletes a finished cell's checkpoints: the middle and end
# checkpoints that scripts/gradient_buckets.py reads (the start is the warm start). Not committed;
# run beside the suite on the machine that runs it: nohup scripts/keep_bucket_checkpoints.sh &
cd "$(dirname "$0")/.."
suite=docs/experiments/warm-start-frozen-lake/runs
keep=runs/grad-buckets
while true; do
  left=0
  for seed in 0 1 2; do
    cell=frozen_lake--ppo--none--s$seed
    mkdir -p "$keep/$cell/checkpoints"
    cp -f "$suite/$cell/config.yaml" "$keep/$cell/" 2>/dev/null
    for step in 000005 000010; do
      dest="$keep/$cell/checkpoints/step_$step"
      [ -e "$dest/state.json" ] && continue
      left=1
      src="$suite/$cell/checkpoints/step_$step"
      [ -e "$src/state.json" ] || continue
      mkdir -p "$dest" && cp -al "$src/policy" "$dest/" && cp "$src/state.json" "$dest/" && echo "kept $cell step_$step $(date)"
    done
  done
  [ $left -eq 0 ] && break
  # The last checkpoint lives only from its save to the runner's next commit poll (up to 60 s,
  # often seconds): a 30 s poll missed seed 0's step 10 on 2026-12-07. Stat calls are cheap.
  sleep 2
done
