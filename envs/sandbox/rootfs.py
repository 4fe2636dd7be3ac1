"""The allow-list that becomes the program's filesystem root.

The root is an empty tmpfs; into it the launcher binds, read-only, only what Python needs:
the real interpreter binary, its standard library (with any site-packages / dist-packages
inside it covered by an empty directory), the shared libraries its extension modules load,
/etc/ld.so.cache, and /dev/{null,zero,full,random,urandom}. Everything else on the host
(problem data, site-packages, the repository checkout, home directories, socket files,
/dev/shm, /tmp) is simply absent, whatever the install layout.

Which libraries: a helper interpreter imports every extension module of lib-dynload and
lists what is mapped (/proc/self/maps); done once per host process. Symlinks on the way to
each file (/lib -> usr/lib, libz.so.1 -> libz.so.1.2.13) are recreated so that the dynamic
loader finds them by the names it looks up.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

PACKAGE_DIRS = ("site-packages", "dist-packages")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

_MAPPED_FILES = r"""
import importlib, os
directory = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
# No display, terminal, sound device or NIS server inside: these modules could not work there,
# and their libraries (X11, Tcl/Tk, Kerberos, ...) would be most of the root's mounts.
useless = ("_tkinter", "nis", "ossaudiodev", "_curses", "_curses_panel", "readline", "_test", "xxlimited", "_xxtest")
for name in sorted(os.listdir(directory) if os.path.isdir(directory) else []):
    if name.endswith(".so") and not name.startswith(useless):
        try:
            importlib.import_module(name.split(".")[0])
        except BaseException:
            pass
seen = set()
for line in open("/proc/self/maps"):
    fields = line.split(None, 5)
    if len(fields) == 6 and fields[5].startswith("/"):
        seen.add(fields[5].rstrip("\n"))
print("\n".join(sorted(seen)))
"""

_lock = threading.Lock()
_cached: tuple | None = None


class RootPlanError(OSError):
    """The allow-listed root cannot be built on this host."""


def interpreter() -> str:
    return os.path.realpath(sys.executable)


def stdlib_dir() -> str:
    return os.path.realpath(os.path.dirname(os.__file__))


def _loader_path(binary: str) -> str | None:
    """The ELF interpreter (PT_INTERP) of `binary`, so that exec'ing Python inside works."""
    try:
        with open(binary, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    found = re.search(rb"(/[\w./-]*ld-[\w.-]*\.so[\w.]*)\x00", head)
    return found.group(1).decode() if found else None


class _Plan:
    def __init__(self):
        self.entries: dict[str, tuple] = {}

    def add(self, path: str, kind: str) -> None:
        """Make `path` resolve inside the root as it does on the host, ending in a bind of `kind`."""
        parts = [part for part in path.split("/") if part]
        current = ""
        for index, part in enumerate(parts):
            current += "/" + part
            if os.path.islink(current):
                target = os.readlink(current)
                self.entries.setdefault(current, ("symlink", current, target))
                resolved = os.path.normpath(os.path.join(os.path.dirname(current), target))
                return self.add("/".join([resolved, *parts[index + 1:]]), kind)
        if current and current not in self.entries:
            self.entries[current] = (kind, current)


def _mapped_files() -> list[str]:
    try:
        out = subprocess.run([interpreter(), "-I", "-S", "-c", _MAPPED_FILES], capture_output=True, text=True,
                             timeout=60, env={}, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise RootPlanError(f"could not list the interpreter's shared libraries: {error}") from None
    return [line for line in out.splitlines() if line.startswith("/") and os.path.isfile(line)]


def plan() -> tuple:
    """The launcher's list of ("symlink"|"file"|"tree"|"cover", path[, target]) entries (cached)."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = _build()
        return _cached


def _build() -> tuple:
    result = _Plan()
    stdlib = stdlib_dir()
    for name in sorted(os.listdir("/")):  # /lib -> usr/lib and friends, as the loader expects them
        if os.path.islink("/" + name):
            result.entries["/" + name] = ("symlink", "/" + name, os.readlink("/" + name))
    result.add(interpreter(), "file")
    loader = _loader_path(interpreter())
    if loader and os.path.exists(loader):
        result.add(loader, "file")
    result.add(stdlib, "tree")
    for path in _mapped_files():
        real = os.path.realpath(path)
        if real == stdlib or real.startswith(stdlib + os.sep) or real == interpreter():
            continue
        result.add(path, "file")
        directory = os.path.dirname(real)  # the names the loader looks up: libz.so.1 -> libz.so.1.2.13
        for entry in os.listdir(directory):
            full = os.path.join(directory, entry)
            if os.path.islink(full) and os.path.realpath(full) == real:
                result.add(full, "file")
    for extra in ("/etc/ld.so.cache",):
        if os.path.isfile(extra):
            result.add(extra, "file")
    for device in DEVICES:
        if os.path.exists(device):
            result.entries[device] = ("file", device)
    entries = list(result.entries.values())
    # Package directories inside the standard library (a system Python's site-packages)
    # are covered after the tree is bound: the program sees them empty.
    for name in PACKAGE_DIRS:
        inside = os.path.join(stdlib, name)
        if os.path.isdir(inside) and not os.path.islink(inside):
            entries.append(("cover", inside))
    return tuple(entries)


def with_hidden(entries: tuple, hide_paths: tuple[str, ...]) -> tuple:
    """The plan with `hide_paths` covered where they fall inside an allowed tree (above one, they
    are absent already, but for the interpreter's own files). A path the interpreter itself
    needs cannot be hidden from it: that is an error, not a silent exposure."""
    extra = []
    for path in hide_paths:
        real = os.path.realpath(path)
        for kind, allowed, *_ in entries:
            if kind not in ("file", "tree"):
                continue
            if real == allowed or (kind == "file" and real.startswith(allowed + "/")):
                raise RootPlanError(f"cannot hide {path}: the interpreter needs {allowed}")
            if kind == "tree" and real.startswith(allowed + "/") and os.path.exists(real):
                if not os.path.isdir(real):
                    raise RootPlanError(f"cannot hide the single file {path} inside {allowed}: hide its directory")
                extra.append(("cover", real))
    return entries + tuple(extra)
