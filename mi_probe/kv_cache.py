"""Which forward argument takes a KV cache, decided in one place.

transformers >= 5.2x names it `cache`; older versions, and wrappers written for them, only know
`past_key_values`. mi_probe's cross-scoring, ragen2's rollout (rollout/kv_rows) and its
shared-prefix passes (ragen2/shared_prefix) all ask here; it sits in mi_probe because
mi_probe sits below the ragen2 package and imports none of it, so both may import this.
"""

from __future__ import annotations

import inspect
from typing import Any


def cache_argument(module: Any) -> str:
    """`cache` when `module`'s forward takes one by that name, else `past_key_values`."""
    try:
        names = inspect.signature(module.forward if hasattr(module, "forward") else module).parameters
    except (TypeError, ValueError):  # a builtin or C-implemented forward: assume the older name
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"
