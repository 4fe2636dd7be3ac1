"""Published numbers a suite can print beside its own (success rate, percent).

RAGEN-2's main table, transcribed from mll-lab-nu/RAGEN `public/main_results.png` (added in
commit cdc052b, "Update V2"; the README shows it under "SNR-Adaptive Filtering"). Each cell is
the validation success (%) without a filter and, in brackets, the change with the filter (top-p
0.9 in softmax mode over the in-group reward std, zero-spread groups kept: our `ragen2-main`
preset); 400 steps. The Average column is kept too: tests check each row against it.

Base models, from RAGEN's scripts/runs and docs/experiment_main_table.md:
  Baseline and Algorithm rows   Qwen/Qwen2.5-3B (run_main_table_diff_algo.sh: "Model: Qwen2.5-3B
                                only"), not the Instruct model. The PPO row is the same run.
  Model Scale (PPO)             Qwen/Qwen2.5-{0.5B,1.5B,7B} (run_main_table_diff_size.sh).
  Model Type                    Qwen/Qwen2.5-3B-Instruct (run_main_table_diff_model.sh's default).
                                The table says "Llama3.2-3B"; that script's only Llama entry is
                                meta-llama/Llama-3.2-3B-Instruct, so the row is most likely the
                                Instruct model: not confirmed, both names are matched.
  Modality                      Qwen2.5-VL-3B on text (T) or image (V) observations, Sokoban and
                                FrozenLake only; kept for completeness, matched to no cell (ragen2
                                has no image observations).
"""

from __future__ import annotations

import re

ENVS = ("sokoban", "frozen_lake", "metamathqa", "countdown")
CELLS = ("no_filter", "filter")  # the two columns of each env

# (label, algo preset, model labels it stands for, {env: (no-filter %, gain with the filter)}, average)
MAIN_TABLE = [
    ("PPO, Qwen2.5-3B", "ppo", ("Qwen2.5-3B",),
     (12.9, 16.0), (67.0, 10.9), (92.6, 0.6), (97.9, 0.0), (67.6, 6.9)),
    ("DAPO", "ragen2-dapo", ("Qwen2.5-3B",), (16.2, 5.1), (66.8, 2.1), (90.8, 2.8), (95.7, 1.6), (67.4, 2.9)),
    ("GRPO", "ragen2-grpo", ("Qwen2.5-3B",), (12.1, 9.0), (70.9, 2.3), (91.2, 1.2), (95.7, 2.2), (67.5, 3.7)),
    ("Dr. GRPO", "ragen2-dr-grpo", ("Qwen2.5-3B",),
     (12.1, -0.4), (23.2, 0.6), (91.2, 1.4), (96.5, 1.4), (55.8, 0.8)),
    ("PPO, Qwen2.5-0.5B", "ppo", ("Qwen2.5-0.5B",),
     (3.3, 22.9), (19.5, 0.0), (10.0, -0.2), (23.0, -0.7), (14.0, 5.5)),
    ("PPO, Qwen2.5-1.5B", "ppo", ("Qwen2.5-1.5B",),
     (17.0, 6.2), (36.5, 1.6), (80.3, 7.0), (56.6, 1.6), (47.6, 4.1)),
    ("PPO, Qwen2.5-7B", "ppo", ("Qwen2.5-7B",), (42.4, 4.9), (85.0, -0.6), (84.0, 11.7), (97.7, 0.3), (77.3, 4.1)),
    ("PPO, Qwen2.5-3B-Instruct", "ppo", ("Qwen2.5-3B-Instruct",),
     (22.5, 14.2), (83.6, 2.3), (91.2, 0.4), (96.3, -0.6), (73.4, 4.1)),
    ("PPO, Llama3.2-3B", "ppo", ("Llama-3.2-3B", "Llama-3.2-3B-Instruct"),
     (24.4, 18.8), (84.6, -0.2), (86.1, 3.7), (99.2, -1.2), (73.6, 5.3)),
    ("PPO, Qwen2.5-VL-3B (T)", "ppo", (), (53.0, 6.0), (16.0, 53.5), None, None, (34.5, 29.8)),
    ("PPO, Qwen2.5-VL-3B (V)", "ppo", (), (65.0, 12.0), (19.5, 59.5), None, None, (42.3, 35.8)),
]

PUBLISHED = {
    "ragen2-main": {
        "source": "RAGEN-2 main table (mll-lab-nu/RAGEN public/main_results.png, commit cdc052b); "
                  "PPO/DAPO/GRPO/Dr. GRPO on Qwen2.5-3B, other models with PPO",
        "metric": "success rate (%)",
        "default_model": "Qwen2.5-3B",  # the row shown beside a run of another model (bundled, …)
        "filters": {"none": "no_filter", "ragen2-main": "filter"},  # our filter preset -> column
        "rows": MAIN_TABLE,
    },
}


def _key(label: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", label.lower())


def published_row(setting: str, algo: str, model: str | None = None) -> tuple | None:
    """The table row of this algo preset and model; for a model the table lacks, the algo's row
    on the setting's default model (the report says the scale differs)."""
    table = PUBLISHED[setting]
    rows = [row for row in table["rows"] if row[1] == algo]
    for wanted in ([model] if model else []) + [table["default_model"]]:
        match = next((row for row in rows if _key(wanted) in map(_key, row[2])), None)
        if match is not None:
            return match
    return None


def published_value(setting: str | None, algo: str, env: str, filter_preset: str,
                    model: str | None = None) -> float | None:
    """Published success (%) for a cell, or None where the table has no such cell."""
    if setting is None:
        return None
    column = PUBLISHED[setting]["filters"].get(filter_preset)
    row = published_row(setting, algo, model)
    if column is None or row is None or env not in ENVS:
        return None
    cell = row[3 + ENVS.index(env)]
    if cell is None:
        return None
    no_filter, gain = cell
    return no_filter if column == "no_filter" else round(no_filter + gain, 1)
