"""What the model wrote: a few trajectories per training step, with their parse results and reward.

    records = pick(batch, n=2, kept_groups=selection.kept)   # the step's best and worst trajectory
    log = CompletionsLog(run_dir, resume_step)                # ragen2.run_dir: completions.jsonl
    log.write(step, records); print(console_text(records))

One JSON line per recorded trajectory in `RUN_DIR/completions.jsonl`: `step` (0-based, as in
metrics.jsonl), `group` / `member` / `seed` (the env instance), `rank` ("best", "worst", …),
`reward`, `success`, `kept` (its group survived the SNR filter; null where unknown), and per
turn the env's `state` before it, the model's `response`, the turn's `reward` and `parse`
(`format_ok`, `error`, actions `parsed` / `executed`, `num_invalid`, `finish_reason`), then
`final_state`. Which trajectories: a pure function of the rewards (no RNG draw), so a run's
numbers are the same with recording on or off.
"""

from __future__ import annotations

STATE_CHARS = 1000  # env states can be long (a DeepCoder problem): the file keeps their head
CONSOLE_CHARS = 160  # per turn on the console


def choose(rewards: list[float], n: int) -> list[tuple[int, str]]:
    """(index, rank label) of n trajectories, taken best, worst, 2nd best, 2nd worst, …; among
    equal rewards the earlier trajectory goes first. Listed from the best down to the worst."""
    n = min(n, len(rewards))
    best_first = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))
    worst_first = sorted(range(len(rewards)), key=lambda i: (rewards[i], i))
    best: list[int] = []
    worst: list[int] = []
    while len(best) + len(worst) < n:
        side, source = (best, best_first) if len(best) == len(worst) else (worst, worst_first)
        side.append(next(i for i in source if i not in best and i not in worst))
    labels = [(i, "best" if k == 0 else f"best_{k + 1}") for k, i in enumerate(best)]
    return labels + [(i, "worst" if k == 0 else f"worst_{k + 1}") for k, i in reversed(list(enumerate(worst)))]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more chars]"


def trajectory_record(traj, rank: str, kept: bool | None = None) -> dict:
    """One TrajectoryRecord (ragen2.rollout.batch) as a completions.jsonl row, without the step."""
    turns = []
    for k, response in enumerate(traj.response_texts):
        actions = traj.actions[k] if k < len(traj.actions) else {}
        turns.append({
            "state": _clip(traj.observations[k], STATE_CHARS) if k < len(traj.observations) else None,
            "response": response,
            "reward": traj.turn_rewards[k],
            "parse": {"format_ok": traj.format_ok[k], "error": traj.parse_errors[k], **actions,
                      "finish_reason": traj.finish_reasons[k]},
        })
    final = traj.observations[len(turns)] if len(traj.observations) > len(turns) else None
    return {"group": traj.group, "member": traj.member, "seed": traj.seed, "rank": rank, "reward": traj.reward,
            "success": traj.success, "kept": kept, "context_truncated": traj.context_truncated,
            "num_turns": len(turns), "turns": turns,
            "final_state": None if final is None else _clip(final, STATE_CHARS)}


def pick(batch, n: int, kept_groups=None) -> list[dict]:
    """The n recorded trajectories of a step's (pre-filter) RolloutBatch; [] when n is 0."""
    if n <= 0:
        return []
    trajs = batch.trajectories
    kept = None if kept_groups is None else {int(g) for g in kept_groups}
    return [trajectory_record(trajs[i], rank, None if kept is None else trajs[i].group in kept)
            for i, rank in choose([t.reward for t in trajs], n)]


def _one_line(text: str, limit: int = CONSOLE_CHARS) -> str:
    # a random model's bytes include control characters: keep them off the terminal
    flat = " ".join("".join(c if c.isprintable() or c.isspace() else "\ufffd" for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _signed(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f}"  # the OpenRLHF engine has no per-turn rewards


def _turn_flag(parse: dict) -> str:
    if not parse.get("format_ok"):
        return "format error" + (f": {parse['error']}" if parse.get("error") else "")
    if parse.get("num_invalid"):
        return f"{parse['num_invalid']} invalid action(s)"
    return "ok" if parse.get("executed", True) else "no valid action"


def console_text(records: list[dict]) -> str:
    """A few compact lines per trajectory, for under the step line."""
    lines = []
    for r in records:
        kept = "" if r.get("kept") is None else (" kept" if r["kept"] else " filtered out")
        lines.append(f"  [{r['rank']}] group {r['group']} member {r['member']} seed {r['seed']} | "
                     f"reward {_signed(r['reward'], 3)} | success {'yes' if r['success'] else 'no'}{kept}")
        for k, turn in enumerate(r["turns"]):
            lines.append(f"    turn {k + 1} ({_turn_flag(turn['parse'])}, {_signed(turn['reward'], 2)}): "
                         f"{_one_line(turn['response'])}")
    return "\n".join(lines)


def markdown(records: list[dict]) -> str:
    """The step's records for TensorBoard's text tab (markdown; responses as code blocks)."""
    parts = []
    for r in records:
        parts.append(f"**{r['rank']}**: group {r['group']}, member {r['member']}, seed {r['seed']}, "
                     f"reward {_signed(r['reward'], 3)}, success {r['success']}")
        for k, turn in enumerate(r["turns"]):
            parts.append(f"turn {k + 1} ({_turn_flag(turn['parse'])}, reward {_signed(turn['reward'], 2)}):\n\n"
                         + "\n".join("    " + line for line in turn["response"].splitlines() or [""]))
    return "\n\n".join(parts)


TABLE_COLUMNS = ["step", "rank", "group", "member", "seed", "reward", "success", "kept", "num_turns",
                 "format_ok_turns", "responses", "parse_errors"]


def table_rows(step: int, records: list[dict]) -> list[list]:
    """Rows of a wandb.Table (TABLE_COLUMNS): the turns' responses joined, one row per trajectory."""
    rows = []
    for r in records:
        turns = r["turns"]
        rows.append([step, r["rank"], r["group"], r["member"], r["seed"], r["reward"], r["success"], r["kept"],
                     r["num_turns"], sum(bool(t["parse"]["format_ok"]) for t in turns),
                     "\n---\n".join(t["response"] for t in turns),
                     "; ".join(f"turn {k + 1}: {t['parse']['error']}" for k, t in enumerate(turns)
                               if t["parse"]["error"])])
    return rows
