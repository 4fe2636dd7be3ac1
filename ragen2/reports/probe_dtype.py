"""What a run's MI probe scored in, and the one line that says when compared runs differ.

The probe scores in the policy's compute dtype by default (`probe.dtype=policy`: bf16 where
`model.dtype` resolved it) or in fp32 (`probe.dtype=float32`), and every probe row records which
(`probe/dtype`). bf16 moves L by its rounding, and so MI and retrieval a little
(docs/benchmarks.md, MI probe cost): runs scored in different dtypes do not compare exactly, so
`ragen2 audit RUN RUN ...` and `ragen2 bench report` say so when they put such runs side by side.
"""

from __future__ import annotations

from ragen2 import metric_names as names

UNKNOWN = "unknown"


def run_probe_dtypes(rows: list[dict], config: dict | None = None) -> list[str]:
    """The dtypes a run's probe rows scored in, in first-seen order; [] when no row probed.

    Rows written before the probe recorded its dtype take it from the run's config.yaml: no
    `probe.dtype` there (or float32) is fp32, the only precision that code scored in; `policy` is
    the run's resolved `model.dtype`."""
    found: dict[str, None] = {}
    for row in rows:
        if not any(key.startswith(names.PROBE) and key != names.PROBE_TIME_S for key in row):
            continue
        dtype = row.get(names.PROBE_DTYPE)
        found[dtype if isinstance(dtype, str) else _from_config(config)] = None
    return list(found)


def _from_config(config: dict | None) -> str:
    if not isinstance(config, dict):
        return UNKNOWN
    probe, model = config.get("probe") or {}, config.get("model") or {}
    requested = probe.get("dtype", "float32")
    if requested == "float32":
        return "float32"
    resolved = model.get("dtype")
    return resolved if resolved in ("float32", "bfloat16", "float16") else UNKNOWN


def mixed_dtypes_line(dtypes_of: dict[str, list[str]], what: str = "runs") -> str | None:
    """One line when the named runs' probes scored in more than one dtype, else None.

    `dtypes_of`: run label -> `run_probe_dtypes` of that run (runs without a probe row are left
    out of the comparison, since they have no MI to compare)."""
    by_dtype: dict[str, list[str]] = {}
    for label, dtypes in dtypes_of.items():
        for dtype in dtypes:
            by_dtype.setdefault(dtype, []).append(label)
    if len(by_dtype) < 2:
        return None
    groups = "; ".join(f"{dtype}: {', '.join(labels)}" for dtype, labels in sorted(by_dtype.items()))
    return (f"note: the MI probe scored in different dtypes across these {what} ({groups}); their MI, "
            "L and retrieval differ by bf16's rounding as well, so compare runs scored alike "
            "(probe.dtype=float32 scores every machine's runs in fp32)")
