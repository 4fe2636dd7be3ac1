"""scripts/probe_controls.py's known-truth check and its summary: what it calls grounded must be a
fact of the instance's own input, and the table's pooled numbers must be the seeds' own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_controls.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("probe_controls_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAKE = "\nTurn 1:\nState:\n____\n__OG\n__P_\n__O_\nYou have 10 actions left. Always output: ..."
COUNTDOWN = "\nTurn 1:\nState:\nTarget: 73, nums: [48, 80, 55]\nYou have 1 actions left."


def test_a_grid_reasoning_counts_only_when_it_names_the_players_own_cell_first(tool):
    assert tool.player_cell(LAKE) == (2, 2)
    assert tool.states_own_input("frozen_lake", LAKE, "At (2, 2), goal (1, 3). Holes (1, 2), (3, 2).")
    assert not tool.states_own_input("frozen_lake", LAKE, "At (1, 1), goal (2, 2). Safest: Up, Up.")
    assert not tool.states_own_input("frozen_lake", LAKE, "Let me think about the best move and then answer.")
    assert tool.player_cell("\nState:\n____\n_X__\nYou have") == (1, 1)  # the player on a hole still counts


def test_a_countdown_reasoning_counts_only_with_its_own_target_and_numbers(tool):
    own = "The target is 73 and the numbers are 48, 80, 55. (48 + 80) - 55 = 73"
    assert tool.states_own_input("countdown", COUNTDOWN, own)
    assert not tool.states_own_input("countdown", COUNTDOWN, own.replace("55.", "56."))
    assert not tool.states_own_input("countdown", COUNTDOWN, own.replace("73 and", "74 and"))
    assert not tool.states_own_input("countdown", COUNTDOWN, "Let me think about the best move and then answer.")


def test_the_summary_pools_seeds_per_env_kind_and_steps_and_the_table_shows_it(tool, tmp_path):
    def row(kind, seed, retrieval, mi):
        return {"env": "countdown", "reasoning": kind, "seed": seed, "sft_steps": 10, "retrieval_at_1": retrieval,
                "chance": 0.04, "mi": mi, "mi_zscore": mi * 9, "entropy": 0.1, "states_own_input": retrieval,
                "distinct_reasoning_share": 1.0}
    results = [row("grounded", 0, 1.0, 1.1), row("grounded", 1, 0.5, 0.9), row("template", 0, 0.0, 0.0)]
    path = tmp_path / "controls.json"
    tool.write_results(path, results, command="x")
    data = json.loads(path.read_text())
    grounded, template = data["summary"]
    assert (grounded["reasoning"], grounded["seeds"], grounded["seed_count"]) == ("grounded", [0, 1], 2)
    assert grounded["retrieval_at_1"] == {"mean": 0.75, "min": 0.5, "max": 1.0}
    assert template["mi"] == {"mean": 0.0, "min": 0.0, "max": 0.0} and data["command"] == "x"
    lines = tool.table(path).splitlines()
    assert lines[2].startswith("| countdown | grounded | 10 | 2 | 0.750 (0.500 to 1.000) |")
    assert lines[3].startswith("| countdown | template | 10 | 1 | 0.000 | 1.000 | 0.000 | 0.040 | 0.0000 |")
