"""The OpenRLHF engine: the same config trained on Ray + vLLM + DeepSpeed (OpenRLHF 0.11.2).

- ``flags``: config → OpenRLHF 0.11.2 command-line flags and the files the run needs (pure:
  no OpenRLHF import), with a clear error for every value OpenRLHF cannot express.
- ``agent``: ``AgentExecutor`` for ``--train.agent_func_path``: our envs and prompt format
  inside OpenRLHF's vLLM rollout workers.
- ``selection`` / ``probe_scoring``: the SNR filter on a step's samples and the MI probe's
  cross-scoring through a log-prob forward (pure torch, no OpenRLHF import).
- ``trainer_patch``: the PPO controller subclass that applies them (imports OpenRLHF).
- ``launch``: ``ragen2 train --engine openrlhf`` and the process that starts
  ``openrlhf.cli.train_ppo_ray`` with the subclass installed.

See docs/distributed.md.
"""

OPENRLHF_VERSION = "0.11.2"
SETTINGS_ENV = "RAGEN2_OPENRLHF_SETTINGS"  # the trainer subclass's settings (JSON), in every Ray worker
SMOKE_LOG_ENV = "RAGEN2_SMOKE_LOG"  # where smoke_agent.py records (scripts/gpu_smoke.sh)
