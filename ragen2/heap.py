"""Keep freed memory in the process (glibc), so each training step stops paying page faults.

A step allocates and frees the same large buffers again and again: autocast's weight casts and
their gradients, the logits, the embedding's dense gradient. glibc serves blocks from 128 KiB up
with mmap and unmaps them at free, and trims the heap's free top, so every step asks the kernel
for those pages again and the kernel zeroes each one at its first touch. In a virtual machine
whose host takes back freed guest memory (virtio-balloon free page reporting), that first touch
also costs a fault on the host. On this project's CPU machine the default-shape update spent
about half its time in those faults (docs/step_speed.md, "Freed memory kept in the process").

`keep_freed_memory` asks glibc to serve every block from its heap (M_MMAP_MAX = 0) and to trim
the heap's top only past 2 GiB free (M_TRIM_THRESHOLD): freed blocks are reused by the next
step. The resident set then stays near the step's peak, which the step reaches anyway, instead
of falling between phases. Process-wide, so the command-line entry points call it (`ragen2`, the
bench worker), never an import; `RAGEN2_RETURN_FREED_MEMORY=1` keeps glibc's defaults (a
machine shared with other memory-hungry jobs), and a run with `trainer.keep_freed_memory=false`
returns to them (`return_freed_memory`): long multi-turn rows fragment the kept heap, and a
1-step Sokoban run peaked 1.3 GB higher with it. Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT_ENV = "RAGEN2_RETURN_FREED_MEMORY"
# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
GLIBC_MMAP_MAX = 65536  # glibc's defaults
GLIBC_THRESHOLD_BYTES = 128 * 1024
# mallopt takes an int: the largest threshold it can hold, 2 GiB - 1
TRIM_THRESHOLD_BYTES = 2 ** 31 - 1

_state = "glibc defaults (this process did not call ragen2.heap.keep_freed_memory)"


def _glibc():
    """The process's C library when it is glibc (mallopt acts there), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):  # musl and others have no gnu_get_libc_version
        return None
    version.restype = ctypes.c_char_p
    return libc


def keep_freed_memory() -> str:
    """Apply the policy above to this process; returns a line saying what was done or why not."""
    global _state
    if os.environ.get(OPT_OUT_ENV, "").strip() not in ("", "0"):
        _state = f"glibc defaults: freed memory goes back to the kernel ({OPT_OUT_ENV} is set)"
        return _state
    libc = _glibc()
    if libc is None:
        _state = "not glibc: the C library's own allocation policy stands"
        return _state
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    _state = ("freed memory kept in the process (glibc mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
              if applied else "glibc refused mallopt: its defaults stand")
    return _state


def return_freed_memory() -> str:
    """Undo keep_freed_memory for the rest of the process (a run with trainer.keep_freed_memory
    false): large blocks mmapped and the heap trimmed again at glibc's default thresholds (fixed
    at them: glibc stops adapting them once set), and what the heap holds free returned now."""
    global _state
    libc = _glibc()
    if libc is None:
        return _state
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
    libc.mallopt(M_TRIM_THRESHOLD, GLIBC_THRESHOLD_BYTES)
    libc.mallopt(M_MMAP_THRESHOLD, GLIBC_THRESHOLD_BYTES)
    libc.malloc_trim(0)
    _state = "freed memory returned to the kernel (trainer.keep_freed_memory=false; glibc's default thresholds)"
    return _state


def state() -> str:
    """What this process's allocator does with freed memory, as the last keep_freed_memory or
    return_freed_memory call left it."""
    return _state
