"""Metric names are defined once (ragen2.metric_names): every name a reader reads is written.

Two halves make the guarantee. Statically: no module of ragen2, benchmarks/ or scripts/ spells a
defined name as a literal (writers and readers import the constant), and the pure readers
(reports, bench, run_dir, commands) spell no metric-like literal at all, so a reader cannot name
a metric the module does not define. Dynamically: a 1-step run of a tiny model with every instrument on writes
every name the module defines for the local engine, so a writer that renames or drops one
(snr and mi_probe spell theirs themselves) fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import snr.stopping
from ragen2 import metric_names as names
from ragen2.cli import main
from ragen2.config import ProbeSection
from ragen2.instruments.probe import Probe
from ragen2.reports.audit_report import GRAD_KEY
from ragen2.run_dir import read_metrics
from tests.tiny import tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

RAGEN2 = Path(names.__file__).parent
ROOT = RAGEN2.parent
# Where a defined name must come from the module: the package, and the benchmarks and scripts
# that read its rows (a writer's rename would otherwise leave them reading a missing key).
IMPORTERS = (RAGEN2, ROOT / "benchmarks", ROOT / "scripts")
# Modules that only read rows: any metric-like literal in them would be a name nobody defines.
READERS = ("reports", "bench", "commands", "run_dir.py")
METRIC_LIKE = re.compile(r"^(rollout|val|probe|snr|actor|critic|time|update|env|grad|grad_prefilter|openrlhf)/")
# Written only by the OpenRLHF engine (its agent's per-episode logs, its copy of OpenRLHF's own).
OPENRLHF_ONLY = {names.ENV_NUM_TURNS, names.ENV_FORMAT_OK_FRACTION, names.ENV_VALID_ACTION_FRACTION,
                 names.ENV_CONTEXT_TRUNCATED}
# Written instead of the probe's scores when it cannot score (test_a_probe_that_cannot_score_says_so).
UNSCORED = {names.PROBE_SKIPPED_TOO_FEW_GROUPS}


def defined_names() -> dict[str, str]:
    """Constant -> full metric name (prefixes and bare batch fields left out)."""
    return {const: value for const, value in vars(names).items()
            if const.isupper() and isinstance(value, str) and "/" in value and not value.endswith(("/", "@"))}


def string_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def spelled_names(folders) -> list[str]:
    """`path:line 'name'` of every defined name spelled as a literal under `folders`."""
    defined = {value: const for const, value in defined_names().items()}
    return [f"{path.relative_to(folder.parent)}:{line} {value!r} (use metric_names.{defined[value]})"
            for folder in folders for path in sorted(folder.rglob("*.py")) if path.name != "metric_names.py"
            for line, value in string_literals(path) if value in defined]


def test_no_module_spells_a_defined_name_itself():
    # the benchmarks and scripts are there to scan (a moved folder would pass vacuously)
    assert all(any(folder.glob("*.py")) for folder in IMPORTERS[1:])
    assert spelled_names(IMPORTERS) == []


def test_the_scan_finds_a_planted_name(tmp_path):
    (tmp_path / "reader.py").write_text('step_s = row["time/step_s"]\nlabel = "time/step"\n')
    assert spelled_names([tmp_path]) == [f"{tmp_path.name}/reader.py:1 'time/step_s' (use metric_names.TIME_STEP_S)"]


def test_readers_name_no_metric_the_module_does_not_define():
    files = [p for entry in READERS for p in ((RAGEN2 / entry).rglob("*.py") if (RAGEN2 / entry).is_dir()
                                              else [RAGEN2 / entry])]
    assert len(files) > 10  # the scan found the readers
    literal = [f"{path.relative_to(RAGEN2.parent)}:{line} {value!r}" for path in sorted(files)
               for line, value in string_literals(path) if METRIC_LIKE.match(value)]
    assert literal == []


def test_snr_spells_the_spread_as_defined():
    # snr imports nothing of ragen2: its stop policy's spread name must equal ours by value.
    assert snr.stopping.SPREAD_METRIC == names.SNR_REWARD_STD_MEAN


def test_a_tiny_run_writes_every_name_the_readers_read(tiny_model_dir, tmp_path):
    # Every instrument on: PPO (critic) with a KL loss, probe and both gradient decompositions
    # every step, validation; the probe scores whole replies, which a random model always writes.
    code = main(["train", "--quiet", "--env", "bandit", "--algo", "ppo", "--filter", "none",
                 "--model", str(tiny_model_dir), "--out", str(tmp_path), "--steps", "1", "trainer.run_name=r",
                 "rollout.num_groups=3", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
                 "trainer.val_before=false", "optim.micro_batch_size=2", "optim.mini_batch_size=6",
                 "algo.kl_coef=0.01", "algo.kl_mode=loss", "probe.every=1", "probe.segment=reply",
                 "probe.grad_every=1", "probe.grad_prefilter=true"])
    assert code == 0
    (row,) = read_metrics(tmp_path / "r")
    expected = {value for value in defined_names().values() if value not in OPENRLHF_ONLY | UNSCORED}
    assert sorted(expected - set(row)) == []
    assert names.val_pass_at(2) in row
    grad = [key for key in row if GRAD_KEY.match(key)]  # what the audit's decomposition panel reads
    assert grad and all(key.startswith(names.GRAD + "/") for key in grad)


def test_a_probe_that_cannot_score_says_so():
    # One group gives no other prompt to score against: the probe returns before any model call.
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 3:] = True
    batch = SimpleNamespace(group_ids=torch.tensor([0, 0]), response_mask=mask, input_ids=torch.arange(12).reshape(2, 6),
                            turn_index=torch.where(mask, 0, -1), reasoning_spans=[], traj_index=torch.arange(2))
    metrics = Probe(ProbeSection(segment="reply"), tiny_tokenizer("chatml")).measure(None, batch, step=0)
    assert UNSCORED <= set(metrics) and names.PROBE_MI_ESTIMATE not in metrics
