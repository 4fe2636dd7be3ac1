"""The preset layers of the training config (ragen2.config.load_config composes them).

Env and algo presets are package data of ragen2 (`ragen2/configs/envs`, `configs/algos`); the
filter presets belong to snr (`snr/presets`, read with `snr.load_preset`), so snr finds them
from a wheel without ragen2. Every name is matched by one rule, `snr.find_preset`'s: case, `_`
and `-` do not matter, and a typo gets a "did you mean" and the list of what exists.
"""

from __future__ import annotations

from pathlib import Path

import yaml

import snr
from snr import preset_key


def _config_dir() -> Path:
    """The presets, package data of ragen2 (`configs/` at the repository root links to them)."""
    from importlib.resources import files

    return Path(str(files("ragen2") / "configs"))


CONFIG_DIR = _config_dir()


class ConfigError(ValueError):
    """A config that cannot be built; the message names the key."""


def key_value(item: str, flag: str = "override", example: str = "trainer.total_steps=50") -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY stripped, VALUE as written): the one reader of the command line's
    assignments (dotted overrides, --env-arg, --env-override). Not one: a ConfigError naming `flag`."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{flag} {item!r} is not KEY=VALUE (e.g. {example})")
    return key.strip(), value


def key_values(items, flag: str, example: str) -> dict[str, str]:
    """Several `KEY=VALUE` items as a dict, the last of a repeated key winning."""
    return dict(key_value(item, flag, example) for item in items)


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def preset_dir(group: str) -> Path:
    """Filter presets belong to snr (package data there); env and algo presets to ragen2."""
    return snr.PRESETS_DIR if group == "filters" else CONFIG_DIR / group


def preset_path(group: str, name: str) -> Path:
    try:
        return snr.find_preset(name, preset_dir(group), kind=group[:-1])
    except snr.FilterConfigError as error:
        raise ConfigError(str(error)) from None


def load(group: str, name: str) -> dict:
    """`name` is a preset of `group` (envs, algos, filters) or a path to a YAML file."""
    if group == "envs" and not (Path(name).suffix in (".yaml", ".yml") or Path(name).is_file()):
        by_key = {preset_key(p.stem): p for p in preset_dir(group).glob("*.yaml")}
        if preset_key(name) not in by_key:
            return _env_preset(name, by_key)
    if group == "filters":  # validated by snr's own loader, then merged as the filter section
        try:
            return snr.load_preset(name).to_dict()
        except snr.FilterConfigError as error:
            raise ConfigError(str(error)) from None
    return read_yaml(preset_path(group, name))


def preset_name(group: str, name: str) -> str:
    """The preset's own spelling (its file name), for labels and run names."""
    return preset_path(group, name).stem


def _env_preset(name: str, by_key: dict[str, Path]) -> dict:
    """An env without a preset file of its own (larger_sokoban, bandit_rev, …) takes the preset of
    the env it is a variant of (same class: its turns and lengths), under its own name."""
    import envs

    try:
        entry = envs.spec(name)
    except envs.EnvConfigError as error:
        raise ConfigError(str(error)) from None
    if ":" in name:  # module:Class keeps its import path, so a later process (resume, eval) finds it too
        return {"env": {"name": name}}
    for path in by_key.values():
        preset = read_yaml(path)
        family = (preset.get("env") or {}).get("name")
        try:
            if family and envs.spec(family).env_cls is entry.env_cls:
                env_section = {"name": entry.name}  # the variant's own defaults, not the family's overrides
                return {**preset, "env": env_section}
        except envs.EnvConfigError:
            continue
    return {"env": {"name": entry.name}}


def choice(section: str, given: str | None, overrides) -> tuple[str | None, list[str]]:
    """`env.name=X` picks env X as `--env X` does (the env's preset, not the previous env's settings),
    and `algo.name=X` the algo preset X as `--algo X`: a name alone would only relabel the run (a run
    named ppo without a critic). Returns the choice and the overrides without `algo.name`."""
    key = f"{section}.name"
    named = [key_value(item)[1].strip() for item in overrides if key_value(item)[0] == key]
    if not named:
        return given, list(overrides)
    if given is not None and preset_key(named[-1]) != preset_key(given):
        raise ConfigError(f"the {section} is given twice: --{section} {given} and {key}={named[-1]}; give it once")
    if section == "algo":  # the preset's own spelling names the run
        overrides = [item for item in overrides if key_value(item)[0] != key]
    return given or named[-1], list(overrides)


def check_algo_label(name, preset_name: str | None, advantage: str) -> None:
    """A layer after the presets (a --config file) that renames the algo (`name`) to an algo
    preset's name must also have that preset's estimator (`advantage`, as resolved): `algo: {name:
    ppo}` over dapo's settings trains no critic."""
    if not isinstance(name, str) or name == preset_name:
        return
    by_key = {preset_key(p.stem): p for p in (CONFIG_DIR / "algos").glob("*.yaml")}
    if preset_key(name) not in by_key:
        return  # a label of the user's own
    wanted = read_yaml(by_key[preset_key(name)]).get("algo", {}).get("advantage")
    if wanted is not None and advantage != wanted:
        stem = by_key[preset_key(name)].stem
        raise ConfigError(f"algo.name={name} names the {stem} preset (algo.advantage={wanted}), but the config "
                          f"has algo.advantage={advantage}: the name would only relabel the run. Pick the algorithm "
                          f"with --algo {stem}, or give these settings a name of their own (algo.name=...)")


_BUNDLED_GROUPS = ("paper",)  # the bundled configs --config takes by name (envs/algos have flags)


def bundled_configs() -> list[str]:
    """Names `--config` takes besides paths: `paper/ragen2-main`, … (package data, so a wheel has them)."""
    return sorted(f"{group}/{p.stem}" for group in _BUNDLED_GROUPS for p in (CONFIG_DIR / group).glob("*.yaml"))


def config_file(name: str | Path) -> Path:
    """An extra config: a YAML file here, else a bundled config by name (`paper/ragen2-main`; a
    `configs/paper/ragen2-main.yaml` path, as in a checkout, finds the bundled copy from anywhere)."""
    path = Path(name)
    if path.is_file():
        return path
    relative = str(name).removeprefix("./").removeprefix("configs/")
    group, _, stem = relative.removesuffix(".yaml").removesuffix(".yml").rpartition("/")
    if group in _BUNDLED_GROUPS:
        try:
            return snr.find_preset(stem, CONFIG_DIR / group, kind=f"{group} config")
        except snr.FilterConfigError:
            pass
    raise ConfigError(f"config file {name} does not exist; bundled configs (--config NAME): "
                      f"{', '.join(bundled_configs())}")


def _label_value(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _derived(label: str, wanted: dict, have: dict) -> str:
    """`label` plus each of `have`'s settings that differs from `wanted` (the preset's, by key):
    `ragen2-main+value=1.0`."""
    changed = [f"{key}={_label_value(value)}" for key, value in have.items()
               if key != "name" and key in wanted and wanted[key] != value]
    return "+".join([label, *changed])


def derived_labels(cfg) -> dict[str, str]:
    """The labels a run's config names itself by, said from its settings. `filter_preset` and
    `algo.name` that name a preset whose settings the config no longer has (the paper config's
    advice `filter.value=1.0`, an `algo.advantage=` override) get the difference appended, so an
    unfiltered run is never labelled ragen2-main; labels of the user's own stay as they are.
    Returns {"filter_preset": ..., "algo.name": ...}."""
    filters = {preset_key(p.stem): p for p in preset_dir("filters").glob("*.yaml")}
    algos = {preset_key(p.stem): p for p in (CONFIG_DIR / "algos").glob("*.yaml")}
    filter_label, algo_label = cfg.filter_preset, cfg.algo.name
    if preset_key(filter_label) in filters:  # the fields that change what this filter keeps
        wanted = snr.load_preset(filters[preset_key(filter_label)]).to_dict()
        filter_label = _derived(filter_label, wanted, cfg.filter.deciding_fields())
    if preset_key(algo_label) in algos:  # the settings the algo preset makes
        wanted = read_yaml(algos[preset_key(algo_label)]).get("algo", {})
        have = cfg.algo.model_dump()
        algo_label = _derived(algo_label, wanted, {key: have[key] for key in wanted if key in have})
    return {"filter_preset": filter_label, "algo.name": algo_label}
