"""The config reference: every key of the training config with its type, default and meaning.

Read from what the validation itself uses, so it cannot drift from it: the pydantic sections of
`ragen2.config` (types and bounds from the models, meanings from the comments beside each field)
and the library dataclasses (`RolloutConfig`, `snr.FilterConfig`, `snr.StopConfig`,
`mi_probe.CollapseDetectorConfig`: meanings from their docstrings). The default shown is what
`ragen2 train` starts from (`configs/base.yaml` over the Python defaults), with the Python
default beside it where base.yaml changes it.

    python -m ragen2.config_reference --out docs/config.md   # regenerate the committed page
    ragen2 train --explain rollout.group_size                # one key
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import json
import re
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel

from ragen2.config import Config, ConfigError, load_config


@dataclass(frozen=True)
class Key:
    key: str  # dotted, e.g. rollout.group_size
    type: str
    default: str  # as ragen2 train starts (base.yaml applied)
    field_default: str  # the Python default, where base.yaml does not set it the same
    meaning: str
    section: str  # the top-level section


# --- meanings --------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _comments_by_line(path: str) -> dict[int, str]:
    source = Path(path).read_text(encoding="utf-8")
    out = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out[token.start[0]] = token.string.lstrip("#").strip()
    return out


@lru_cache(maxsize=None)
def _model_comments(cls: type) -> dict[str, str]:
    """Field -> the comment lines just above it and the comments on its own lines."""
    path = inspect.getsourcefile(cls)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    comments = _comments_by_line(path)
    _, first = inspect.getsourcelines(cls)
    node = ast.parse(inspect.getsource(cls)).body[0]
    out = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        start, end = first + item.lineno - 1, first + item.end_lineno - 1
        above, line = [], start - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        inline = [comments[n] for n in range(start, end + 1) if n in comments]
        out[item.target.id] = " ".join(above + inline)
    return out


def _docstring_fields(cls: type) -> dict[str, str]:
    """A dataclass docstring's field list (`name   text`, continued on deeper-indented lines)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    current: list[str] = []
    for line in doc.splitlines():
        match = re.match(r"^(\w+(?:, \w+)*)\s{2,}(\S.*)$", line)
        if match and set(match.group(1).split(", ")) <= names:
            current = match.group(1).split(", ")
            for name in current:
                out[name] = match.group(2).strip()
        elif current and line.startswith(" ") and line.strip():
            for name in current:
                out[name] += " " + line.strip()
        else:
            current = []
    for name in names - set(out):  # documented inside another field's entry (window_turns in context)
        where = [other for other, text in out.items() if re.search(rf"\b{name}\b", text)]
        if where:
            out[name] = f"see {where[0]}"
    return out


# --- types and values ------------------------------------------------------------------------


def _type_name(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) if not isinstance(a, str) else a for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [f"{signs[name]} {getattr(item, name)}" for item in metadata for name in signs if hasattr(item, name)]
    return f" ({', '.join(parts)})" if parts else ""


def _value(value) -> str:
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


# --- walking the config ----------------------------------------------------------------------


def _walk(cls: type, prefix: str, started: dict, python: dict):
    if dataclasses.is_dataclass(cls):
        meanings, hints = _docstring_fields(cls), typing.get_type_hints(cls)
        fields = [(f.name, hints[f.name], "", meanings.get(f.name, "")) for f in dataclasses.fields(cls)]
    else:
        meanings = _model_comments(cls)
        fields = [(name, f.annotation, _bounds(f.metadata), meanings.get(name, ""))
                  for name, f in cls.model_fields.items()]
    for name, annotation, bounds, meaning in fields:
        key = f"{prefix}{name}"
        if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
            yield from _walk(annotation, f"{key}.", started, python)
            continue
        default, field_default = _value(_lookup(started, key)), _value(_lookup(python, key))
        yield Key(key, _type_name(annotation) + bounds, default, "" if field_default == default else field_default,
                  meaning, key.split(".")[0])


@lru_cache(maxsize=1)
def keys() -> tuple[Key, ...]:
    started = json.loads(load_config().model_dump_json())
    python = json.loads(Config().model_dump_json())
    return tuple(_walk(Config, "", started, python))


SECTION_NOTES = {
    "model": "The model and where it runs.",
    "env": "The env and its own settings (`ragen2 envs list` shows each env's keys; set them with "
           "`--env-arg KEY=VALUE`, i.e. `env.overrides.KEY=VALUE`).",
    "rollout": "How a step samples; the fields of `ragen2.rollout.RolloutConfig`.",
    "algo": "Advantage estimator and losses (`--algo` picks a preset; `algo.name=X` does the same).",
    "filter_preset": "The filter preset's name, for labels and run names (`--filter` sets it).",
    "filter": "The SNR filter; the fields of `snr.FilterConfig` (`--filter` picks a preset of `snr/presets/`). "
              "A field set away from its default that the strategy does not read is refused, with the strategy "
              "that reads it: value, metric, order, include_zero and signal under strategy none, top_p_mode "
              "outside top_p, eps outside linear top_p (`filter.value=0.5` alone is an error, not top-p 0.5).",
    "stop": "When to stop a run the filter finds no signal in; the fields of `snr.StopConfig`.",
    "optim": "Optimisers and the PPO update.",
    "trainer": "The loop: steps, seeds, validation, checkpoints, logging.",
    "probe": "The template-collapse probe and the gradient decomposition; `probe.collapse` is "
             "`mi_probe.CollapseDetectorConfig`.",
    "openrlhf": "`--engine openrlhf` only (docs/distributed.md); the local engine ignores it.",
    "sft": "`ragen2 sft` only: the supervised warm start on `ragen2 demos` files (docs/warm_start.md).",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    lines = [
        "# Config reference",
        "",
        "Every key of the training config: `ragen2 train KEY=VALUE` sets one, `--config FILE` a YAML tree of them,",
        "`ragen2 train --explain KEY` prints one. The default is what `ragen2 train` starts from",
        "(`configs/base.yaml` over the Python defaults; the Python default follows in brackets where",
        "base.yaml changes it); `--env`, `--algo`, `--filter` and `--config` presets change more.",
        "",
        "Generated by `python -m ragen2.config_reference --out docs/config.md` from the config's own",
        "models (ragen2/config.py and the library dataclasses); a test checks this page is current.",
    ]
    section = None
    for key in keys():
        if key.section != section:
            section = key.section
            lines += ["", f"## {section}", "", SECTION_NOTES.get(section, ""), "",
                      "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        default = f"`{key.default}`" + (f" (`{key.field_default}`)" if key.field_default else "")
        lines.append(f"| `{key.key}` | {_cell(key.type)} | {_cell(default)} | {_cell(key.meaning)} |")
    return "\n".join(lines) + "\n"


def explain(name: str) -> str:
    """One key (or every key of a section) as text; ConfigError with a "did you mean" otherwise."""
    chosen = [k for k in keys() if k.key == name] or [k for k in keys() if k.key.startswith(f"{name}.")]
    if not chosen:
        close = difflib.get_close_matches(name, [k.key for k in keys()], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; sections: " + ", ".join(SECTION_NOTES)
        raise ConfigError(f"no config key {name!r}{hint}")
    out = []
    for key in chosen:
        default = key.default + (f" (Python default {key.field_default}; base.yaml sets {key.default})"
                                 if key.field_default else "")
        out.append(f"{key.key}\n  type     {key.type}\n  default  {default}\n  meaning  {key.meaning or '-'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the config reference (markdown).")
    parser.add_argument("--out", type=Path, help="file to write (default: print)")
    args = parser.parse_args(argv)
    text = markdown()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
