"""Bench suites: a YAML matrix of training runs, expanded into cells and validated up front.

A suite (configs/bench/NAME.yaml, or any path) looks like

    name: main-table
    description: RAGEN-2's main table ...
    published: ragen2-main          # optional: published numbers to print beside ours
    baseline: none                  # treatment the deltas are measured from (default: the first)
    keep_final_checkpoint: false    # keep the last checkpoint of a finished cell (for `ragen2 eval`)
    validate_before: false          # validate each cell's untrained model too (the curve's step 0)
    equal_budgets: [env_episodes]   # budgets compared arms must spend equally: the report warns
                                    # where they do not (names: ragen2.bench.comparisons.BUDGETS)
    scale_config: configs/paper/ragen2-main.yaml   # optional; its algo/filter sections are ignored
    seeds: [0, 1, 2]                # default for matrices that do not list their own
    overrides: [trainer.val_every=10]             # every cell
    matrices:
      - name: main
        algos: [ppo, dapo, grpo, dr-grpo]         # configs/algos presets (null = base.yaml's)
        filters: [none, snr-top-p]                # snr/presets (null = the algo's own)
        envs: [sokoban, frozen_lake]              # configs/envs presets (null = base.yaml's)
        models: [bundled]                         # optional: model.name values
        variants: {p0.6: [filter.value=0.6]}      # optional: named override sets, one more axis
        overrides: []                             # this matrix only
        compare: filter                           # table columns: filters (default) or algos
        baseline: none                            # this matrix's own baseline treatment

Each cell is one ordinary run directory `<out>/runs/<cell name>`. A cell's config layers, later
wins: base → env → algo → filter presets (as `ragen2 train`), then the scale config's sections,
suite overrides, matrix overrides, the model, the variant, `--set` overrides, and the cell's
seed and run directory.

With `validate_before`, each cell also validates its untrained model before its first update
(the same validation as during training; kept in the run directory, see ragen2.bench.worker):
the report's "val before" column and the first point of the validation curves, so a change is
read against where the model started. Cells that share a seed start from the same model, but
each validates on its own: which cells could share one depends on the env, model, rollout and
validation settings of a general matrix, and one validation is small beside a cell's training.

The scale config is applied as overrides rather than as a preset layer
so that it sets the scale (model, rollout, optimiser, steps) while the matrix's algo and filter
presets stay in force: configs/paper files also fix an algo section, which would otherwise
turn every algorithm of the main table into PPO.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ragen2.bench.comparisons import BUDGETS
from ragen2.bench.published import PUBLISHED
from ragen2.config import CONFIG_DIR, Config, ConfigError, build_config, load_config, upgrade_saved

SUITE_DIR = CONFIG_DIR / "bench"
SUITE_KEYS = {"name": str, "description": str, "published": str, "baseline": str, "keep_final_checkpoint": bool,
              "validate_before": bool, "scale_config": str, "seeds": list, "overrides": list, "matrices": list,
              "equal_budgets": list}
MATRIX_KEYS = {"name": str, "algos": list, "filters": list, "envs": list, "seeds": list, "models": list,
               "variants": dict, "overrides": list, "baseline": str, "compare": str}
COMPARE = ("filter", "algo")  # what a matrix's table compares side by side within an env
SCALE_SECTIONS_IGNORED = ("algo", "filter", "filter_preset")  # the matrix chooses these
# A run keeps only its newest checkpoint (a 135M checkpoint is ~1.5 GB): enough to resume.
# val_before: a suite validates the untrained model by its own validate_before (bench_val_before.json)
# a suite's cells keep the probe cadence they were designed with when the main job's default changes
BENCH_DEFAULTS = ("trainer.keep_last=1", "trainer.val_before=false", "probe.every=5")


class SuiteError(ValueError):
    """A suite that cannot be expanded; the message names the file and the key."""


@dataclass
class Cell:
    name: str
    matrix: str
    env: str  # labels: the resolved preset names, used by the report's tables
    algo: str
    filter: str
    variant: str  # "" when the matrix has no variants
    model: str
    seed: int
    compare: str  # "filter": columns are filters, rows algorithms; "algo": columns are algorithms
    overrides: list[str]  # everything after the presets, in order
    presets: dict  # {"env": …, "algo": …, "filter": …} as passed to load_config (None = default)
    config: Config
    run_dir: Path
    baseline: str  # the treatment label deltas are measured from

    row: str = ""  # the table row: the algorithm (compare: filter) or the filter (compare: algo)

    @property
    def treatment(self) -> str:
        """What the table compares within a row and env: the filter (or algo), plus the variant."""
        compared = self.algo if self.compare == "algo" else self.filter
        return f"{compared}/{self.variant}" if self.variant else compared

    def record(self) -> dict:
        """The JSON-able description kept in the bench manifest."""
        return {"name": self.name, "matrix": self.matrix, "env": self.env, "algo": self.algo, "filter": self.filter,
                "variant": self.variant, "model": self.model, "seed": self.seed, "treatment": self.treatment,
                "row": self.row, "compare": self.compare, "baseline": self.baseline, "run_dir": str(self.run_dir),
                "presets": self.presets, "overrides": self.overrides}


@dataclass
class Suite:
    name: str
    path: Path
    data: dict
    description: str = ""
    published: str | None = None
    keep_final_checkpoint: bool = False
    validate_before: bool = False
    matrices: list[dict] = field(default_factory=list)


# --- loading -------------------------------------------------------------------------------


def suite_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise SuiteError(f"suite file {path} does not exist")
        return path
    candidate = SUITE_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        available = sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))
        raise SuiteError(f"unknown suite '{name_or_path}'; available in {SUITE_DIR}: {available} (or give a path)")
    return candidate


def _check_types(where: str, data: dict, keys: dict, required: tuple[str, ...]) -> None:
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(keys)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise SuiteError(f"{where}: missing key(s) {missing}")
    for key, kind in keys.items():
        if key in data and not isinstance(data[key], kind):
            raise SuiteError(f"{where}.{key}: expected {kind.__name__}, got {type(data[key]).__name__} "
                             f"({data[key]!r})")


def _check_list(where: str, values: list, allow_none: bool, kind=str) -> None:
    if not values:
        raise SuiteError(f"{where}: must list at least one value")
    for value in values:
        if value is None and allow_none:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SuiteError(f"{where}: {value!r} is not a {kind.__name__}")
    if len(set(map(str, values))) != len(values):
        raise SuiteError(f"{where}: repeated values in {values}")


def _check_overrides(where: str, items) -> None:
    if not isinstance(items, list):
        raise SuiteError(f"{where}: expected a list of KEY=VALUE overrides, got {items!r}")
    for item in items:
        if not isinstance(item, str) or "=" not in item or item.startswith("="):
            raise SuiteError(f"{where}: {item!r} is not KEY=VALUE (e.g. trainer.total_steps=4)")


def load_suite(name_or_path: str) -> Suite:
    path = suite_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SuiteError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping with keys {sorted(SUITE_KEYS)}")
    _check_types(str(path), data, SUITE_KEYS, ("name", "matrices"))
    if not data["matrices"]:
        raise SuiteError(f"{path}.matrices: must list at least one matrix")
    if "seeds" in data:
        _check_list(f"{path}.seeds", data["seeds"], False, int)
    _check_overrides(f"{path}.overrides", data.get("overrides", []))
    names = set()
    for index, matrix in enumerate(data["matrices"]):
        where = f"{path}.matrices[{index}]"
        if not isinstance(matrix, dict):
            raise SuiteError(f"{where}: expected a mapping with keys {sorted(MATRIX_KEYS)}")
        _check_types(where, matrix, MATRIX_KEYS, ("name", "algos", "envs"))
        if matrix["name"] in names:
            raise SuiteError(f"{where}.name: matrix name {matrix['name']!r} is used twice")
        names.add(matrix["name"])
        if matrix.get("compare", "filter") not in COMPARE:
            raise SuiteError(f"{where}.compare: {matrix['compare']!r} is not one of {list(COMPARE)}")
        for key in ("algos", "filters", "envs", "models"):
            if key in matrix:
                _check_list(f"{where}.{key}", matrix[key], allow_none=key != "models")
        seeds = matrix.get("seeds", data.get("seeds"))
        if seeds is None:
            raise SuiteError(f"{where}: no seeds (set `seeds` here or at the top of the suite)")
        _check_list(f"{where}.seeds", seeds, False, int)
        if any(s < 0 for s in seeds):
            raise SuiteError(f"{where}.seeds: seeds are whole numbers >= 0, got {seeds}")
        for name, items in matrix.get("variants", {}).items():
            if not re.fullmatch(r"[A-Za-z0-9_.+-]+", str(name)):
                raise SuiteError(f"{where}.variants: name {name!r} may hold only letters, digits and _ . + -")
            _check_overrides(f"{where}.variants.{name}", items)
        _check_overrides(f"{where}.overrides", matrix.get("overrides", []))
    unknown = [b for b in data.get("equal_budgets", []) if b not in BUDGETS]
    if unknown:
        raise SuiteError(f"{path}.equal_budgets: unknown budget(s) {unknown}; known: {list(BUDGETS)}")
    if "published" in data:
        if data["published"] not in PUBLISHED:
            raise SuiteError(f"{path}.published: unknown published setting {data['published']!r}; "
                             f"known: {sorted(PUBLISHED)}")
    return Suite(name=data["name"], path=path, data=data, description=data.get("description", ""),
                 published=data.get("published"), keep_final_checkpoint=data.get("keep_final_checkpoint", False),
                 validate_before=data.get("validate_before", False), matrices=data["matrices"])


def flatten(data: dict, prefix: str = "") -> list[str]:
    """{"a": {"b": 1}} → ["a.b=1"]; values written as JSON, which the override parser reads back as YAML."""
    return [f"{dotted}={value}" for dotted, value in dotted_items(data, prefix).items()]


def dotted_items(data: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"}: each leaf's dotted key and its value as JSON."""
    items = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and key != "overrides":
            items.update(dotted_items(value, dotted + "."))
        else:
            items[dotted] = json.dumps(value)
    return items


def scale_overrides(suite: Suite) -> list[str]:
    if "scale_config" not in suite.data:
        return []
    path = Path(suite.data["scale_config"])
    if not path.is_absolute() and not path.is_file():
        path = CONFIG_DIR.parent / path  # relative to the repository (or share/ragen2) root
    if not path.is_file():
        raise SuiteError(f"{suite.path}.scale_config: {suite.data['scale_config']} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    return flatten({k: v for k, v in data.items() if k not in SCALE_SECTIONS_IGNORED})


# --- expansion -----------------------------------------------------------------------------


def _label(value: str | None, resolved: str) -> str:
    return resolved if value is None else Path(str(value)).stem if str(value).endswith((".yaml", ".yml")) else value


def _model_label(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(name.rstrip("/")).name or name)


def expand(suite: Suite, out: Path, extra_overrides: list[str] = ()) -> list[Cell]:
    """Every cell of every matrix, each config built and validated now (before any model loads).

    Order: matrix by matrix, seed-major, so that a partially run suite already holds whole
    comparisons for its first seed.
    """
    shared = [*BENCH_DEFAULTS, *scale_overrides(suite), *suite.data.get("overrides", [])]
    cells: list[Cell] = []
    for index, matrix in enumerate(suite.matrices):
        where = f"{suite.path}.matrices[{index}] ({matrix['name']})"
        variants = matrix.get("variants") or {"": []}
        models = matrix.get("models") or [None]
        seeds = matrix.get("seeds", suite.data.get("seeds"))
        matrix_cells = []
        axes = itertools.product(seeds, matrix["envs"], matrix["algos"], matrix.get("filters", [None]), models,
                                 variants.items())
        for seed, env, algo, filter_name, model, (variant, variant_overrides) in axes:
            overrides = [*shared, *matrix.get("overrides", []), *([f"model.name={model}"] if model is not None else []),
                         *variant_overrides, *extra_overrides, f"trainer.seed={seed}"]
            presets = {"env": env, "algo": algo, "filter": filter_name}
            try:
                cfg = load_config(**presets, overrides=overrides)
            except ConfigError as error:
                raise SuiteError(f"{where}: cell env={env} algo={algo} filter={filter_name} model={model} "
                                 f"variant={variant or '-'} seed={seed}: {error}") from None
            matrix_cells.append(Cell(
                name="", matrix=matrix["name"], env=_label(env, cfg.env.name), algo=_label(algo, cfg.algo.name),
                # the preset's name without a variant's changes (`starpo-s+value=0.5`): the variant names those
                filter=_label(filter_name, cfg.filter_preset.partition("+")[0]), variant=variant,
                model=_model_label(cfg.model.name),
                seed=seed, compare=matrix.get("compare", "filter"), overrides=overrides, presets=presets, config=cfg,
                run_dir=Path(), baseline=""))
        treatments = list(dict.fromkeys(c.treatment for c in matrix_cells))
        baseline = matrix.get("baseline", suite.data.get("baseline", treatments[0]))
        if baseline not in treatments:
            raise SuiteError(f"{where}.baseline: {baseline!r} is not one of this matrix's treatments {treatments}")
        several_models = len(models) > 1
        for cell in matrix_cells:
            parts = [cell.env, cell.algo, cell.filter, cell.variant, cell.model if several_models else "",
                     f"s{cell.seed}"]
            if len(suite.matrices) > 1:
                parts.insert(0, matrix["name"])
            cell.name = "--".join(p for p in parts if p)
            cell.baseline = baseline
            # compare: algo with filters left to the algo presets (null): one row per model
            explicit_filters = any(matrix.get("filters", [None]))
            row = cell.algo if cell.compare == "filter" else (cell.filter if explicit_filters else "all")
            cell.row = f"{row} ({cell.model})" if several_models else row
        cells += matrix_cells
    seen: dict[str, Cell] = {}
    for cell in cells:
        if cell.name in seen:
            raise SuiteError(f"{suite.path}: two cells are both named {cell.name!r} (the same env, algo, filter, "
                             f"variant and seed twice): remove the repeat")
        seen[cell.name] = cell
        cell.run_dir = Path(out) / "runs" / cell.name
        # The run directory is part of the config (so resumption compares like with like); setting
        # the two fields equals loading with these overrides, without composing the layers again.
        cell.overrides = [*cell.overrides, f"trainer.out={out}/runs", f"trainer.run_name={cell.name}"]
        cell.config.trainer.out, cell.config.trainer.run_name = f"{out}/runs", cell.name
    return cells


def key_settings(cell: Cell) -> str:
    """One line of what a cell will do, for `ragen2 bench SUITE --list`."""
    c = cell.config
    f = c.filter
    filt = "none" if f.strategy == "none" else f"{f.strategy} {f.value:g} by {f.metric}"
    return (f"{c.trainer.total_steps} steps x {c.rollout.num_groups}x{c.rollout.group_size} | "
            f"turns {c.rollout.max_turns} x {c.rollout.max_new_tokens} tok | {c.algo.name} ({c.algo.advantage}) | "
            f"filter {filt} | lr {c.optim.actor_lr:g} | val {c.trainer.val_groups} groups every "
            f"{c.trainer.val_every or 'end'} | probe {c.probe.every or 'off'} | save {c.trainer.save_every or 'end'} "
            f"| model {c.model.name}")


def config_difference(saved_yaml: str, cfg: Config) -> list[str]:
    """Dotted keys whose values differ between a saved config.yaml and `cfg` (for resume errors)."""
    saved = yaml.safe_load(saved_yaml) or {}
    written = set()
    try:  # as this version reads it: renamed keys are the same key
        saved = upgrade_saved(saved)
        written = set(dotted_items(saved))
        saved = json.loads(build_config(saved).model_dump_json())
    except ConfigError:
        pass
    old = dotted_items(saved)
    new = dotted_items(json.loads(cfg.model_dump_json()))
    # A field the saved file never wrote did not exist when that run started: the user changed
    # no setting there (the code's change is in the cell's recorded commit), so it is no difference.
    added_since = {k for k in new if written and k not in written and k in old}
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in added_since)
