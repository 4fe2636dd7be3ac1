#!/bin/bash
# Run a command with MKL on the code path it takes on Intel CPUs (AVX-512 kernels), on an AMD CPU.
# MKL asks `mkl_serv_intel_cpu_true` whether the CPU is Intel and, on AMD, runs generic kernels;
# a preloaded library answering yes puts it on the Intel path, so failures seen only on the Intel
# machines of this project can be reproduced on the AMD ones (issue 32 item 8):
#   scripts/intel_mkl_path.sh pytest tests/ragen2/engines/local/test_interrupts_and_resume.py
#   MKL_VERBOSE=1 scripts/intel_mkl_path.sh python -c "import torch; torch.ones(64, 64) @ torch.ones(64, 64)"
# (MKL_VERBOSE's first line names the path: "Intel(R) AVX-512" instead of "Intel(R) Architecture
# processors".) The shim is compiled once into /tmp; it changes nothing on an Intel CPU.
set -eu
shim=${TMPDIR:-/tmp}/ragen2-intel-mkl/intel_cpu.so
if [ ! -f "$shim" ]; then
  mkdir -p "$(dirname "$shim")"
  printf 'int mkl_serv_intel_cpu_true(void) { return 1; }\nint mkl_serv_intel_cpu(void) { return 1; }\n' \
    > "${shim%.so}.c"
  cc -shared -fPIC -O2 -o "$shim" "${shim%.so}.c"
fi
LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"
