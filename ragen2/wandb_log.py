"""wandb as its users expect: their login and WANDB_* variables decide, the config names the
project, and a resumed run continues the same wandb run.

The wandb run id is kept in the run directory (`wandb_run_id`), so `--resume` reattaches to it
(`resume="allow"`) instead of starting a second run. Only when nothing says how to log (no
WANDB_MODE, no API key, no `wandb login`) does the run go offline rather than stop at a prompt.
"""

from __future__ import annotations

import netrc
import os
import secrets
from pathlib import Path

# the run directory's file holding the wandb run id, so --resume continues the same run
# (ragen2.run_dir lists it with the directory's other files)
RUN_ID_FILE = "wandb_run_id"


def _logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(os.environ.get("WANDB_BASE_URL", "api.wandb.ai")
                                            .removeprefix("https://").removeprefix("http://")) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def init_kwargs(run_dir: Path, config_dict: dict, trainer: dict) -> dict:
    """The arguments for `wandb.init`; the id is read from (or chosen and written to) the run dir."""
    run_dir = Path(run_dir)
    id_file = run_dir / RUN_ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        run_id = secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
    kwargs = {"project": os.environ.get("WANDB_PROJECT") or trainer.get("wandb_project") or "ragen2",
              "entity": os.environ.get("WANDB_ENTITY") or trainer.get("wandb_entity"),
              "name": trainer.get("wandb_name") or run_dir.name, "tags": list(trainer.get("wandb_tags") or []),
              "dir": str(run_dir), "config": config_dict, "id": run_id, "resume": "allow"}
    if not os.environ.get("WANDB_MODE") and not _logged_in():
        kwargs["mode"] = "offline"  # nothing says online: log locally (`wandb sync` later), never prompt
    return {key: value for key, value in kwargs.items() if value is not None}


def start(run_dir: Path, config_dict: dict, warn):
    """A wandb run, or None (with a warning) where wandb is not installed."""
    try:  # optional dependency
        import wandb
    except ImportError:
        warn("wandb requested but not installed: pip install wandb")
        return None
    return wandb.init(**init_kwargs(run_dir, config_dict, config_dict.get("trainer", {})))
