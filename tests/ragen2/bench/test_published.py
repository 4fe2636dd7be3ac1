"""ragen2.bench.published: RAGEN-2's main table, transcribed, and how cells find their row."""

import pytest

from ragen2.bench.published import ENVS, MAIN_TABLE, PUBLISHED, published_value


@pytest.mark.parametrize("row", MAIN_TABLE, ids=[row[0] for row in MAIN_TABLE])
def test_each_row_agrees_with_the_tables_own_average_column(row):
    # A transcription check: the image prints the row average (one decimal) beside the cells.
    cells = [cell for cell in row[3:3 + len(ENVS)] if cell is not None]
    average, average_gain = row[3 + len(ENVS)]
    assert sum(c[0] for c in cells) / len(cells) == pytest.approx(average, abs=0.05 + 1e-9)
    assert sum(c[1] for c in cells) / len(cells) == pytest.approx(average_gain, abs=0.05 + 1e-9)


def test_main_table_cells_use_the_ragen2_main_filter_column():
    # The main-table suite's cells are labelled with the filter preset `ragen2-main`: the value
    # with the filter is the no-filter value plus the gain.
    assert published_value("ragen2-main", "ppo", "sokoban", "none") == 12.9
    assert published_value("ragen2-main", "ppo", "sokoban", "ragen2-main") == 28.9
    assert published_value("ragen2-main", "ppo", "frozen_lake", "ragen2-main") == 77.9
    assert published_value("ragen2-main", "ragen2-dr-grpo", "sokoban", "ragen2-main") == 11.7
    assert published_value("ragen2-main", "ragen2-dapo", "countdown", "ragen2-main") == 97.3
    # snr-top-p (linear over the variance) is not the filter the table measured; our plain
    # grpo preset is not RAGEN-2's GRPO
    assert published_value("ragen2-main", "ppo", "sokoban", "snr-top-p") is None
    assert published_value("ragen2-main", "grpo", "sokoban", "none") is None
    assert published_value(None, "ppo", "sokoban", "none") is None


def test_the_model_picks_the_row_and_other_models_fall_back_to_the_3b_rows():
    assert published_value("ragen2-main", "ppo", "metamathqa", "none", "Qwen2.5-7B") == 84.0
    assert published_value("ragen2-main", "ppo", "metamathqa", "ragen2-main", "Qwen2.5-7B") == 95.7
    assert published_value("ragen2-main", "ppo", "sokoban", "none", "Qwen2.5-3B-Instruct") == 22.5
    assert published_value("ragen2-main", "ppo", "countdown", "none", "Llama-3.2-3B-Instruct") == 99.2
    assert published_value("ragen2-main", "ppo", "sokoban", "none", "bundled") == 12.9  # the 3B baseline
    assert published_value("ragen2-main", "ppo", "sokoban", "none", "Qwen2.5-3B") == 12.9
    assert len(PUBLISHED["ragen2-main"]["rows"]) == 11
