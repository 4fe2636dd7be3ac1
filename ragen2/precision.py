"""Which precision a model computes in, and the context that applies it.

`model.dtype` names the *compute* precision. Weights (and so the optimiser's moments) stay
fp32 whatever it says — the master copy RL needs, since an update of lr x grad ~ 1e-7 is below
bf16's resolution near 1. With bfloat16 (or float16) the forward runs under `torch.autocast`:
matmuls in the low precision, everything autocast keeps in fp32 (norms, the residual stream)
in fp32, and the callers take log-softmax, log-probs, ratios and losses in fp32.

`auto` (the default) picks bfloat16 where it pays and float32 elsewhere:
- CUDA: bfloat16 where the GPU supports it;
- CPU: bfloat16 where the CPU flags show x86 bf16 units (AMX-BF16, AVX512-BF16), whose
  oneDNN kernels run bf16 matmuls 2-4x faster than fp32; float32 elsewhere. Without the units
  torch emulates bf16, slower than fp32. Arm's BF16 flag is reported but not acted on: torch's
  CPU bf16 kernels there are not known to beat fp32 (set model.dtype=bfloat16 to try).
The CPU flags alone decide, never a timing: an earlier version also required a matmul benchmark
to show bf16 1.5x faster, and under load (or another BLAS path) that benchmark flipped between
processes, so two runs of one config on one machine could compute in different precisions
(issue 32 item 8: a child run's numbers differed from the same run in-process). The choice and
its reason are written into the run's config.yaml (as the resolved dtype) and its log, so a
resumed run computes as the first one did.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU flags (Linux /proc/cpuinfo names) that mean bf16 runs in hardware.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# Those on which auto picks bf16: x86's, where torch's oneDNN kernels use them.
X86_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
_COMPUTE_ATTR = "ragen2_compute_dtype"


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str  # float32 | bfloat16 | float16
    reason: str

    def describe(self) -> str:
        return f"model.dtype={self.dtype}: {self.reason}"


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The bf16 features this CPU reports (Linux: /proc/cpuinfo; macOS arm64: sysctl)."""
    if cpuinfo is None:
        cpuinfo = _read_cpuinfo()
    words: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    return [flag for flag in CPU_BF16_FLAGS if flag in words]


def _read_cpuinfo() -> str:
    path = Path("/proc/cpuinfo")
    if path.is_file():
        return path.read_text(errors="replace")
    if platform.system() == "Darwin":  # Apple M2 and later have FEAT_BF16
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True,
                                 text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
        return "flags: bf16" if out == "1" else ""
    return ""


def matmul_gflops(dtype: torch.dtype, size: int = 1024, seconds: float = 0.15) -> float:
    """Throughput of a size x size matmul in `dtype` on this CPU, over about `seconds` (for
    benchmarks; the auto choice never reads a timing)."""
    generator = torch.Generator().manual_seed(0)  # its own: the global RNG shapes the run being set up
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    a @ b  # warm-up: first call pays the kernel selection
    calls, started = 0, time.perf_counter()
    while True:
        a @ b
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and calls >= 2:
            return 2 * size ** 3 * calls / elapsed / 1e9


def choose_cpu_dtype(flags: list[str]) -> PrecisionChoice:
    """The CPU decision from the CPU's bf16 flags alone (so it is the same in every process)."""
    units = [flag for flag in flags if flag in X86_BF16_FLAGS]
    if units:
        return PrecisionChoice("bfloat16", f"auto: bf16 mixed precision (fp32 weights), {', '.join(units)}")
    if flags:
        return PrecisionChoice("float32", f"auto: float32; this CPU reports {', '.join(flags)}, but torch's CPU "
                                          "bf16 kernels are not known to beat fp32 there (model.dtype=bfloat16 "
                                          "to try)")
    return PrecisionChoice("float32", "auto: this CPU reports no bf16 units (amx_bf16, avx512_bf16, "
                                      "bf16), so bf16 would be emulated and slower")


@functools.lru_cache(maxsize=None)
def _cpu_choice() -> PrecisionChoice:
    return choose_cpu_dtype(cpu_bf16_flags())


def resolve(requested: str, device: torch.device | str = "cpu") -> PrecisionChoice:
    """The compute dtype for `model.dtype=requested` on `device`; an explicit dtype always wins."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ValueError(f"model.dtype must be auto or one of {sorted(DTYPES)}, got {requested!r}")
        return PrecisionChoice(requested, "set in the config")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bfloat16", "auto: bf16 mixed precision (fp32 weights) on a bf16-capable GPU")
        return PrecisionChoice("float32", "auto: this GPU has no bf16 (fp16 needs loss scaling, not used)")
    if device.type == "cpu":
        return _cpu_choice()
    return PrecisionChoice("float32", f"auto: float32 on {device.type}")


def set_compute_dtype(module: torch.nn.Module, dtype: str | torch.dtype) -> torch.nn.Module:
    """Mark `module` to compute in `dtype` (its weights are left as they are)."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    object.__setattr__(module, _COMPUTE_ATTR, dtype)
    return module


def compute_dtype(module) -> torch.dtype:
    """The precision `module` computes in: what set_compute_dtype said, else its weights' dtype."""
    marked = getattr(module, _COMPUTE_ATTR, None)
    if marked is not None:
        return marked
    param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    return param.dtype if param is not None else torch.float32


def autocast(module) -> contextlib.AbstractContextManager:
    """The context a forward of `module` runs in: autocast to its compute dtype, or nothing.

    Wrap forwards and the loss only, never `optimizer.step()`: autocast caches the low-precision
    copy of each weight until the context exits, and a step inside it would leave that copy stale.
    """
    dtype = compute_dtype(module)
    param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    if param is None or dtype == param.dtype:
        return contextlib.nullcontext()
    return torch.autocast(param.device.type, dtype=dtype)


def full_precision(module) -> contextlib.AbstractContextManager:
    """Leave autocast for a part that must stay fp32 (the critic's value head)."""
    param = next(iter(module.parameters()), None)
    device_type = param.device.type if param is not None else "cpu"
    return torch.autocast(device_type, enabled=False)
