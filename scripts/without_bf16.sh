#!/bin/bash
# Run a command as on a CPU without bf16 units (the Intel Xeons with AVX-512 but no bf16 that
# issue 32 item 8 failed on), on a CPU that has them:
#   scripts/without_bf16.sh scripts/shuffled_tests.sh 1 2 3
# - ragen2's `model.dtype=auto` reads the CPU's flags; a sitecustomize (on PYTHONPATH, so child
#   processes get it too) hides amx_bf16/avx512_bf16/bf16 from it when ragen2.precision loads,
#   so auto picks float32 as it does there;
# - oneDNN is capped at AVX-512 without bf16 or AMX (ONEDNN_MAX_CPU_ISA), so no kernel uses them.
# The product has no such switch: this is a test harness, like scripts/intel_mkl_path.sh.
set -eu
site=${TMPDIR:-/tmp}/ragen2-without-bf16
mkdir -p "$site"
cat > "$site/sitecustomize.py" <<'PY'
"""Hide the CPU's bf16 flags from ragen2.precision (scripts/without_bf16.sh)."""
import importlib.abc
import importlib.util
import re
import sys


def _hide_bf16(module):
    read = module._read_cpuinfo
    flags = re.compile(r"\b(?:%s)\b" % "|".join(module.CPU_BF16_FLAGS))
    module._read_cpuinfo = lambda: flags.sub("", read())


class _PatchPrecisionOnLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "ragen2.precision":
            return None
        sys.meta_path.remove(self)  # find the real spec, then wrap its loader once
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hide_bf16(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchPrecisionOnLoad())
PY
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" ONEDNN_MAX_CPU_ISA=AVX512_CORE
exec "$@"
