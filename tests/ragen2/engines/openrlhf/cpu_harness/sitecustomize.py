"""Python runs this at start-up in every process that has this folder on PYTHONPATH: `ragen2 train`,
the launched `python -m ragen2.engines.openrlhf.launch`, and every Ray worker (they inherit the
environment). It does nothing unless the end-to-end test set RAGEN2_OPENRLHF_CPU_HARNESS=1."""
import os

if os.environ.get("RAGEN2_OPENRLHF_CPU_HARNESS") == "1":
    import orl_cpu

    orl_cpu.install()
