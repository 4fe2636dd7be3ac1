"""Template-collapse diagnostics: cross-scoring, MI estimators, EMA z-score, collapse alerts.

Does the reasoning still depend on the input? Score every sampled reasoning z_i under every
prompt x_j of the batch with the policy itself, then compare its own prompt with the others:

    from transformers import LlamaConfig, LlamaForCausalLM
    from mi_probe import CollapseDetector, ZScoreEMA, cross_score, mi_metrics

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4))  # your policy
    prompts = [[1, 5, 9, 4], [1, 7, 3], [1, 2, 8, 8]]     # token ids of each prompt x_j
    reasonings = [[11, 12, 13], [21, 22], [31, 32, 33]]  # token ids of z_i, sampled after prompt owners[i]
    scores = cross_score(model, prompts, reasonings, owners=[0, 1, 2])  # L[i, j] = log p(z_i | x_j)
    metrics = mi_metrics(scores.L, scores.owner, column_ids=scores.column_ids)
    metrics |= ZScoreEMA().update(metrics)  # one tracker per run: MI-ZScore-EMA
    print(metrics["mi_estimate"], metrics["mi_zscore_ema"], metrics["retrieval_accuracy@1"])
    detector = CollapseDetector()           # one per run, fed every step
    alerts = detector.update(0, mi_zscore_ema=metrics["mi_zscore_ema"], entropy=2.3, reward_std=0.4)

`mi_estimate` is at most log N (N prompts); retrieval accuracy@k is compared with its chance
level k / N. The collapse detector alerts when MI falls while entropy does not (template
collapse), and on a reward-std cliff or a gradient-norm spike (see `collapse`).
`mi_probe.gradients` splits a loss's gradient into task / entropy / KL parts.

Imports nothing from ``ragen2``: another trainer can use this package alone.
"""

import importlib

from .collapse import Alert, CollapseDetector, CollapseDetectorConfig

# The estimators need torch; they load on first use, so importing the collapse detector's config
# (a section of the training config) stays light.
_LAZY = {"CrossScores": "cross_scoring", "cross_score": "cross_scoring", "cross_score_naive": "cross_scoring",
         "sample_trajectory_turns": "cross_scoring", "ZScoreEMA": "ema", "DEFAULT_KS": "estimators",
         "DEFAULT_STD_EPS": "estimators", "mi_metrics": "estimators", "mi_metrics_both": "estimators",
         "prompt_identities": "estimators"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Alert",
    "CollapseDetector",
    "CollapseDetectorConfig",
    "CrossScores",
    "DEFAULT_KS",
    "DEFAULT_STD_EPS",
    "ZScoreEMA",
    "cross_score",
    "cross_score_naive",
    "mi_metrics",
    "mi_metrics_both",
    "prompt_identities",
    "sample_trajectory_turns",
]
