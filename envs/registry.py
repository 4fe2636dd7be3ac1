"""The env registry: a name → (class, default config, description) table.

Names are matched ignoring case, `_` and `-`, so `FrozenLake`, `frozen_lake` and
`frozen-lake` are one env. Variants (LargerSokoban, BanditRev, …) are entries with other
default configs, not other classes.

An env of your own needs no change here: `spec("mypkg.module:MyEnv")` imports `mypkg.module`
(which may call `register` itself) and returns the entry of the `TextEnv` subclass `MyEnv`,
registering it under that `module:Class` name with its config class's defaults if the module
did not. The name works wherever an env name does (`ragen2 train --env mypkg.module:MyEnv`),
and in a new process too (a resumed run imports the module again).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import threading
from dataclasses import dataclass

from envs.base import EnvConfig, EnvConfigError, TextEnv

# Modules whose import registers the built-in envs.
BUILTIN_MODULES = (
    "envs.bandit",
    "envs.sokoban",
    "envs.frozen_lake",
    "envs.countdown",
    "envs.metamathqa",
    "envs.searchqa",
    "envs.webshop",
    "envs.deepcoder",
)


@dataclass(frozen=True)
class EnvSpec:
    name: str
    env_cls: type[TextEnv]
    config: EnvConfig
    description: str
    aliases: tuple[str, ...] = ()

    def make_config(self, **overrides) -> EnvConfig:
        valid = [f.name for f in dataclasses.fields(self.config)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise EnvConfigError(
                f"unknown config key(s) {unknown} for env '{self.name}'; valid keys: {sorted(valid)}"
            )
        for key, value in overrides.items():
            _check_type(self.name, key, getattr(self.config, key), value)
        try:
            return dataclasses.replace(self.config, **overrides)
        except EnvConfigError as error:
            raise EnvConfigError(f"env '{self.name}': {error}") from None
        except (TypeError, ValueError) as error:
            raise EnvConfigError(f"env '{self.name}': bad config value: {error}") from None


def _check_type(env: str, key: str, default, value) -> None:
    """Reject a value whose type differs from the default's (an int is a fine float)."""
    if default is None or value is None:
        return
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise EnvConfigError(
            f"env '{env}': {key} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )


def coerce_overrides(entry: EnvSpec, raw: dict[str, str]) -> dict:
    """Turn command-line strings (`dim_x=8`, `require_think=false`) into typed values."""
    import json

    typed = {}
    for key, text in raw.items():
        default = getattr(entry.config, key, None) if hasattr(entry.config, key) else None
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise EnvConfigError(f"env '{entry.name}': {key} must be true or false, got {text!r}")
            typed[key] = text.lower() in ("true", "1", "yes")
        elif isinstance(default, (int, float)):
            try:
                typed[key] = type(default)(float(text)) if isinstance(default, float) else int(text)
            except ValueError:
                raise EnvConfigError(
                    f"env '{entry.name}': {key} must be {type(default).__name__}, got {text!r}"
                ) from None
        elif isinstance(default, (tuple, list, dict)):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise EnvConfigError(f"env '{entry.name}': {key} must be JSON, got {text!r}") from None
            typed[key] = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
        else:
            typed[key] = text
    return typed


_SPECS: dict[str, EnvSpec] = {}
_KEYS: dict[str, str] = {}  # normalised name or alias → canonical name
_LOCK = threading.RLock()
_builtins_loaded = False


def _normalise(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def register(name: str, env_cls: type[TextEnv], config: EnvConfig, description: str,
             aliases: tuple[str, ...] = ()) -> EnvSpec:
    if not isinstance(config, env_cls.config_cls):
        raise EnvConfigError(f"{name}: config must be a {env_cls.config_cls.__name__}")
    spec = EnvSpec(name, env_cls, config, description, tuple(aliases))
    with _LOCK:
        for key in (name, *aliases):
            existing = _KEYS.get(_normalise(key))
            if existing is not None and existing != name:
                raise EnvConfigError(f"env name '{key}' is already taken by '{existing}'")
        _SPECS[name] = spec
        for key in (name, *aliases):
            _KEYS[_normalise(key)] = name
    return spec


def _load_builtins() -> None:
    global _builtins_loaded
    with _LOCK:
        if _builtins_loaded:
            return
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _builtins_loaded = True


def specs() -> list[EnvSpec]:
    """Every registered env, in registration order."""
    _load_builtins()
    with _LOCK:
        return list(_SPECS.values())


def spec(name: str) -> EnvSpec:
    _load_builtins()
    with _LOCK:
        canonical = _KEYS.get(_normalise(str(name)))
        if canonical is not None:
            return _SPECS[canonical]
    if ":" in str(name):
        return _spec_from_import(str(name))
    with _LOCK:
        known = sorted(_SPECS)
    close = difflib.get_close_matches(_normalise(str(name)), {_normalise(n): n for n in known}, n=1, cutoff=0.6)
    hint = f" (did you mean {next(n for n in known if _normalise(n) == close[0])}?)" if close else ""
    raise EnvConfigError(f"unknown env '{name}'{hint}; registered envs: {known}; an env of your own: "
                         f"module.path:ClassName (a TextEnv subclass)")


def _spec_from_import(reference: str) -> EnvSpec:
    """`package.module:Class`: import the module, then the entry of its TextEnv subclass `Class`."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise EnvConfigError(f"env '{reference}': cannot import {module_name} ({error}); is it installed, "
                             f"on PYTHONPATH or in the current folder?") from None
    env_cls = getattr(module, attribute, None)
    if not (isinstance(env_cls, type) and issubclass(env_cls, TextEnv)):
        raise EnvConfigError(f"env '{reference}': {module_name} has no TextEnv subclass named {attribute!r}")
    with _LOCK:
        entry = next((s for s in _SPECS.values() if s.env_cls is env_cls), None)  # the module registered it
        if entry is None:
            doc = (env_cls.__doc__ or "").strip().splitlines()
            entry = register(reference, env_cls, env_cls.config_cls(), doc[0] if doc else reference)
        _KEYS[_normalise(reference)] = entry.name  # the next lookup of this reference is a plain one
        return entry


def make(name: str, **config_overrides) -> TextEnv:
    """Build an env by name; keyword arguments override its default config."""
    entry = spec(name)
    return entry.env_cls(entry.make_config(**config_overrides))
