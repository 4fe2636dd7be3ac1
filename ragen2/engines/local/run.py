"""A local run, in two parts: what a checkpoint saves (`RunState`) and what the run uses
(`RunServices`). `trainer.setup` builds each complete, the state fresh or from a checkpoint.
`StepResult` is what one training step hands back (trainer.train_step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

import envs
import snr
from ragen2.config import Config
from ragen2.engines.local import learner
from ragen2.engines.local.interrupts import Interrupts
from ragen2.instruments import probe as probe_lib
from ragen2.progress import LiveLine
from ragen2.rollout.batch import RolloutBatch
from ragen2.run_dir import DirectoryGuard, RunLog


@dataclass
class RunState:
    """What a checkpoint saves beside the weights and optimiser moments (engines/local/checkpoint):
    the steps done, the sampling generator (torch's global RNG is saved with it) and the state of
    each watcher that counts across steps."""

    generator: torch.Generator  # rollout sampling, batch adjustment, mini-batch order
    stop_policy: snr.StopPolicy  # the filter's skip / spread / validation counts
    probe: probe_lib.Probe  # the MI probe's EMA
    watch: probe_lib.CollapseWatch  # collapse alerts over the logged series
    step: int = 0  # steps done (skipped ones included)
    nonfinite_skips: int = 0  # mini-batches skipped as non-finite, over the run

    @classmethod
    def fresh(cls, cfg: Config, tokenizer) -> RunState:
        return cls(torch.Generator().manual_seed(cfg.trainer.seed), snr.StopPolicy(cfg.stop),
                   probe_lib.Probe(cfg.probe, tokenizer), probe_lib.CollapseWatch(cfg.probe, cfg.trainer.total_steps))

    def to_json(self) -> dict:
        """The checkpoint's JSON state (the generator goes into its tensor file; the step is added
        by checkpoint.save_checkpoint). num_threads is recorded for the resume's warning."""
        return {"stop_policy": self.stop_policy.state_dict(), "probe": self.probe.state_dict(),
                "collapse_detector": self.watch.state_dict(), "nonfinite_skips": self.nonfinite_skips,
                "num_threads": torch.get_num_threads()}

    def load_json(self, state: dict) -> None:
        """Restore from a checkpoint's JSON state (checkpoint.load_latest restored the generator)."""
        self.step = state["step"]
        self.stop_policy.load_state_dict(state["stop_policy"])
        self.probe.load_state_dict(state["probe"])
        if "collapse_detector" in state:  # absent in checkpoints written before the detector was wired
            self.watch.load_state_dict(state["collapse_detector"])
        self.nonfinite_skips = state["nonfinite_skips"]


def env_factory(cfg: Config, name: str | None = None) -> Callable[[], envs.TextEnv]:
    """A maker of the config's env (`name`: another registered env, with its defaults: validation's)."""
    entry = envs.spec(name or cfg.env.name)
    env_config = entry.make_config(**(cfg.env.overrides if name is None else {}))
    return lambda: entry.env_cls(env_config)


@dataclass
class RunServices:
    """What the run uses and a checkpoint does not hold: the models and optimisers (their tensors
    are saved, the objects are built from the config), the env makers, the run's log and
    directory guard, signal handling and the live progress line."""

    models: learner.Models
    optimizers: learner.Optimizers
    make_env: Callable[[], envs.TextEnv]  # training episodes
    make_val_env: Callable[[], envs.TextEnv]  # validation episodes (env.val_name, or the training env)
    log: RunLog
    dir_guard: DirectoryGuard  # stops the run if run_dir is removed or replaced under it
    interrupts: Interrupts
    live: LiveLine  # off unless a terminal


@dataclass
class Run:
    cfg: Config
    run_dir: Path
    state: RunState
    services: RunServices


@dataclass
class StepResult:
    """What `trainer.train_step` observed: its metrics row, the rollout batch and the filter's
    selection of it, the trajectories it recorded, what the watchers saw. Validation (in the loop)
    adds its observation; then the stoppers (engines/local/stoppers) are asked once."""

    metrics: dict
    batch: RolloutBatch | None = None  # the step's rollout, before the filter
    selection: snr.Selection | None = None  # the filter's decision on `batch`
    completions: list = field(default_factory=list)  # ragen2.instruments.completions.pick
    filter_decision: snr.StopDecision = field(default_factory=lambda: snr.StopDecision(False))
    collapse_alert: object | None = None  # a mi_probe.Alert that asks to stop (CollapseWatch.observe)
    validation_decision: snr.StopDecision | None = None  # set when this step validated

    @property
    def watchers_stop(self) -> bool:
        """The filter's policy or the collapse watch asks to stop: the run's last step (it validates its end)."""
        return self.filter_decision.stop or self.collapse_alert is not None
