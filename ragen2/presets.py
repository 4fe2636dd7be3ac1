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
    named = [item.partition("=")[2].strip() for item in overrides if item.partition("=")[0].strip() == key]
    if not named:
        return given, list(overrides)
    if given is not None and preset_key(named[-1]) != preset_key(given):
        raise ConfigError(f"the {section} is given twice: --{section} {given} and {key}={named[-1]}; give it once")
    if section == "algo":  # the preset's own spelling names the run
        overrides = [item for item in overrides if item.partition("=")[0].strip() != key]
    return given or named[-1], list(overrides)


def check_algo_label(data: dict, preset_name: str | None) -> None:
    """A layer after the presets (a --config file) that renames the algo to an algo preset's name
    must also have that preset's estimator: `algo: {name: ppo}` over dapo's settings trains no critic."""
    name = (data.get("algo") or {}).get("name")
    if not isinstance(name, str) or name == preset_name:
        return
    by_key = {preset_key(p.stem): p for p in (CONFIG_DIR / "algos").glob("*.yaml")}
    if preset_key(name) not in by_key:
        return  # a label of the user's own
    preset = read_yaml(by_key[preset_key(name)]).get("algo", {})
    wanted, have = preset.get("advantage"), (data.get("algo") or {}).get("advantage")
    if have is not None and wanted is not None and have != wanted:
        stem = by_key[preset_key(name)].stem
        raise ConfigError(f"algo.name={name} names the {stem} preset (algo.advantage={wanted}), but the config "
                          f"has algo.advantage={have}: the name would only relabel the run. Pick the algorithm "
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
