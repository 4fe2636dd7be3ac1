"""Model layer of the local engine: where weights come from, and the models a training step uses.

- Sources: ``resolve_model_source`` turns a name into what ``from_pretrained`` accepts. ``"bundled"``
  (alias ``"smollm2"``; the default) is SmolLM2-135M-Instruct, read from its GGUF cache
  (``ragen2.bundled_model``). A local directory is used as is; anything else is a Hugging Face hub id.
- Models (fp32 weights; forwards compute in ``dtype``, see ``ragen2.precision``): ``load_policy`` (LoRA
  through ``peft`` optional), ``load_reference``
  (frozen; only when a KL term is on), ``load_value_model`` (PPO critic: same base, own weights,
  scalar head) and ``load_tokenizer``. ``save_model`` / ``load_model_weights`` checkpoint any of them.

Optional dependency: ``peft`` (for LoRA).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from ragen2 import bundled_model, precision
from ragen2.attention import use_grouped_sdpa
from ragen2.bundled_model import SMOLLM2_CHAT_TEMPLATE, ModelSourceError  # handed on: callers import them from here

__all__ = [
    "BUNDLED_NAMES", "DEFAULT_MODEL", "check_model_source", "SMOLLM2_CHAT_TEMPLATE", "ModelSourceError", "ModelWeightsError",
    "LoraSettings", "ValueModel", "pick_device", "resolve_model_source", "load_tokenizer", "load_policy",
    "load_reference", "load_value_model", "apply_lora", "save_model", "load_model_weights",
]

DEFAULT_MODEL = "bundled"
BUNDLED_NAMES = ("bundled", "smollm2", "smollm2-135m-instruct")
WEIGHTS_FILE = "model.safetensors"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

DTypeLike = Union[torch.dtype, str]


class ModelWeightsError(RuntimeError):
    """A weights file that does not fit the model it is loaded into."""


# ----------------------------------------------------------------------------- sources and the cache


def check_model_source(name_or_path: Union[str, os.PathLike] = DEFAULT_MODEL) -> str:
    """What `resolve_model_source` will load, checked without loading anything (fast: for
    failing before a run starts). Returns "bundled", "local" or "hub"."""
    text = str(name_or_path).strip()
    if text.lower() in BUNDLED_NAMES:
        bundled_model.bundled_gguf_path()
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
        return str(bundled_model.ensure_gguf_cache(bundled_model.bundled_gguf_path(),
                                                   bundled_model.model_cache_root() / bundled_model.BUNDLED_CACHE_NAME))
    return str(_model_folder(Path(text).expanduser())) if kind == "local" else text


def _model_folder(path: Path) -> Path:
    """A `ragen2 sft` run directory stands for the model it wrote (RUN/model); any other path for itself."""
    inner = path / "model"
    return inner if not (path / "config.json").is_file() and (inner / "config.json").is_file() else path


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
        return precision.DTYPES[precision.resolve("auto", pick_device(device)).dtype]
    return _as_dtype(dtype)


def pick_device(device: Union[str, torch.device]) -> torch.device:
    """model.device as a torch device: `auto` is the GPU when there is one."""
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
    model = use_grouped_sdpa(_from_pretrained(AutoModelForCausalLM, source, dtype=torch.float32).to(pick_device(device)))
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
    model = use_grouped_sdpa(_from_pretrained(AutoModelForCausalLM, source, dtype=torch.float32).to(pick_device(device)))
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
        in it): what takes a KV cache for shared-prefix passes (ragen2/shared_prefix)."""
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
    return precision.set_compute_dtype(ValueModel(backbone).to(pick_device(device)), compute)


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
