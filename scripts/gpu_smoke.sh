#!/usr/bin/env bash
# GPU smoke test of the OpenRLHF engine on one GPU node with the [openrlhf] extra installed:
# GRPO on Bandit (2 steps: probe, evaluations, checkpoints) and PPO with critic and KL (1 step),
# checked (metrics, |vllm_kl| < 0.02, one weight sync per step, vLLM's stop semantics, evaluation
# instances, peak memory < 95%); prints one JSON line, exit 0 when every check passes.
#
#   scripts/gpu_smoke.sh                       # Qwen/Qwen2.5-0.5B-Instruct on 1 GPU, under runs/gpu_smoke
#   scripts/gpu_smoke.sh --model DIR --gpus 2  # another model (hub id or directory), 2 GPUs
#   scripts/gpu_smoke.sh --dry                 # CPU: everything up to the first GPU-only step
#
# Run it from the repository root with the environment's python first on PATH (or PYTHON=...).
# ragen2/engines/openrlhf/smoke.py has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m ragen2.engines.openrlhf.smoke "$@"
