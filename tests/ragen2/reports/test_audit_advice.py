"""The audit's advice fits what was run (env, think mode, turns, model) and never contradicts
docs/evidence.md: no "more rollouts" for the bundled model on a multi-turn game (it has no spread at
any setting tried: a warm start is the way), no "use a think-mode env" to a think-mode audit."""

import json

import pytest

from ragen2.cli import main
from ragen2.reports import audit_report
from ragen2.reports.audit_verdict import Setting, model_verdict, run_verdict

HUB = "Qwen/Qwen2.5-0.5B-Instruct"


def _run(model="bundled", env="frozen_lake", think=False, turns=5, std_max=0.0, rows=32.0):
    """A run summary as audit_report writes it: no reward spread (by default), probed rows as given."""
    series = {"rollout/in_group_reward_std_mean": {"n": 6, "first": 0.0, "last": 0.0, "max": std_max}}
    config = {"env": env, "model": model, "think_mode": think, "max_turns": turns, "probe": {},
              "rollout": {"num_groups": 8, "group_size": 4}}
    return {"steps": 6, "series": series, "alerts": [], "config": config,
            "run_stats": {"probes": 6, "probe_rows_max": rows, "skipped_steps": 0}}


@pytest.mark.parametrize("env, think, reasoning", [("frozen_lake", False, "none"), ("sokoban", True, "grounded")])
def test_bundled_multi_turn_without_spread_is_sent_to_a_warm_start_not_a_bigger_group(env, think, reasoning):
    label, lines = run_verdict(_run(env=env, think=think, turns=5))
    text = "\n".join(lines)
    assert label == "inconclusive" and "rollout.group_size" not in text and "rollout.temperature" not in text
    assert "no reward spread on multi-turn FrozenLake or Sokoban" in lines[1] and "docs/evidence.md" in lines[1]
    # the warm start for this env, its turns and its mode (answer-only or think-mode demos)
    assert (f"ragen2 demos --env {env} --reasoning {reasoning} --out demos.jsonl rollout.max_turns=5, ragen2 sft "
            f"--demos demos.jsonl trainer.run_name={env}-sft rollout.max_turns=5, then train with --model "
            f"runs/{env}-sft") in lines[1]
    assert lines[-1] == (f"One change would make it conclusive: rerun with --model runs/{env}-sft (the warm start "
                         "above: ragen2 demos, then ragen2 sft; docs/warm_start.md).")


def test_a_bigger_group_stays_the_advice_where_evidence_does_not_rule_it_out():
    for summary in (_run(model=HUB), _run(model="bundled", env="bandit", think=False, turns=1)):
        lines = run_verdict(summary)[1]
        assert "Raise rollout.group_size or rollout.temperature" in lines[1] and "warm" not in lines[1]
        assert lines[-1] == ("One change would make it conclusive: rerun with rollout.group_size=8 (more rollouts "
                             "per prompt, so that some of a group's differ).")


def test_bundled_think_mode_single_turn_without_spread_is_sent_to_answer_only():
    lines = run_verdict(_run(env="bandit", think=True, turns=1))[1]
    assert "Train answer-only (--env-arg require_think=false" in lines[1] and "group_size" not in lines[1]
    assert lines[-1] == ("One change would make it conclusive: rerun with --env-arg require_think=false (answer-only: "
                         "the bundled model rarely closes <think>).")


def _reasoning_advice(**run) -> str:
    lines = run_verdict(_run(std_max=0.4, rows=4.0, **run))[1]
    assert lines[1].startswith("no reasoning to probe: the probe scored at most 4 reasoning segments (needs 16). ")
    assert lines[-1].startswith("One change would make it conclusive: rerun with probe.segment=reply")
    return lines[1]


def test_no_reasoning_advice_never_asks_a_think_mode_run_for_think_mode():
    bundled = _reasoning_advice(env="bandit", think=True, turns=1)
    assert "Think mode was on, but the bundled model rarely writes a well-formed think-mode reply" in bundled
    assert "Train in think mode" not in bundled and "probe.segment=reply" in bundled
    assert "ragen2 demos --env bandit --reasoning grounded" in bundled
    other = _reasoning_advice(model=HUB, think=True)
    assert other.endswith("Give the reasoning room (rollout.max_new_tokens) and probe every step; or probe whole "
                          "replies (probe.segment=reply), which have a row per rollout")


def test_no_reasoning_advice_for_an_answer_only_run_offers_think_mode_to_a_model_that_can_use_it():
    bundled = _reasoning_advice(think=False)
    assert "The run was answer-only (require_think=false), so it wrote no reasoning" in bundled
    assert "think mode" not in bundled.split("wrote no reasoning")[1]  # the bundled model rarely closes <think>
    assert _reasoning_advice(model=HUB, think=False).endswith("; or train in think mode (leave out "
                                                             "require_think=false)")
    # a run whose mode was not recorded keeps the general advice
    assert _reasoning_advice(think=None).split(". ", 1)[1].startswith("Train in think mode (e.g. --env bandit")


# --- the model audit -------------------------------------------------------------------------------------

FEW_ROWS = {"num_rows": 3, "num_distinct_prompts": 8, "format_ok_fraction": 0.03}


def test_model_audit_of_the_bundled_model_in_think_mode_is_not_told_to_use_think_mode():
    label, why = model_verdict({**FEW_ROWS, "model": "bundled", "env": "bandit", "think_mode": True, "max_turns": 1})
    assert label == "inconclusive" and "think-mode env" not in why and "--env bandit," not in why
    assert "so more rollouts or tokens will not help: probe whole replies (--segment reply)" in why
    assert "ragen2 demos --env bandit --reasoning grounded --out demos.jsonl, " in why
    assert why.endswith("then --model runs/bandit-sft)")
    # another model in think mode: more rows and the format, still no "use a think-mode env"
    label, why = model_verdict({**FEW_ROWS, "model": HUB, "env": "bandit", "think_mode": True})
    assert "--groups" in why and "think-mode env" not in why and why.endswith("or probe whole replies (--segment reply)")


def test_model_audit_of_an_answer_only_env_says_there_is_no_reasoning():
    why = model_verdict({**FEW_ROWS, "model": "bundled", "env": "bandit", "think_mode": False})[1]
    assert "the env is answer-only (require_think=false), so there is no reasoning to score" in why
    assert why.endswith("probe whole replies (--segment reply; --segment auto picks them for an answer-only env)")
    why = model_verdict({**FEW_ROWS, "model": HUB, "think_mode": False})[1]
    assert why.endswith(", or audit the env in think mode (leave out require_think=false)")
    # too few prompts, enough rows: only more groups help
    why = model_verdict({**FEW_ROWS, "num_rows": 32, "num_distinct_prompts": 2, "think_mode": True})[1]
    assert why.endswith("To get one: roll out more groups (--groups, --group-size) or raise --max-new-tokens so "
                        "the reasoning closes")


def test_model_audit_format_gate_points_the_bundled_model_to_a_warm_start():
    numbers = {"num_rows": 32, "num_distinct_prompts": 8, "retrieval_chance_level@1": 0.125, "mi_estimate": 0.3,
               "policy_entropy": 1.0, "format_ok_fraction": 0.1, "retrieval_accuracy@1": 0.125}
    why = model_verdict({**numbers, "model": "bundled", "env": "bandit", "think_mode": True})[1]
    assert "The bundled model rarely writes a well-formed think-mode reply" in why and "ragen2 sft" in why
    assert "Use a model that follows" in model_verdict({**numbers, "model": HUB, "think_mode": True})[1]


def test_the_model_audit_command_gives_the_verdict_its_model_and_env(monkeypatch, tmp_path):
    from ragen2.reports import audit

    # no model loads: the command's wiring is what is tested (what reaches the verdict)
    monkeypatch.setattr(audit, "resolve_model", lambda spec: audit.ModelSpec(spec))
    monkeypatch.setattr(audit, "load_model", lambda spec, device="cpu": (None, None))
    monkeypatch.setattr(audit, "audit_model", lambda policy, tok, factory, settings: {
        **FEW_ROWS, "segment": "reasoning", "think_mode": factory().config.require_think,
        "max_turns": settings.max_turns, "policy_entropy": 1.0, "success_rate": 0.0, "think_span_fraction": 0.0})
    out = tmp_path / "numbers.json"
    assert main(["audit", "--model", "bundled", "--env", "bandit", "--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert (numbers["model"], numbers["env"], numbers["think_mode"]) == ("bundled", "bandit", True)
    assert "think-mode env" not in numbers["explanation"] and "runs/bandit-sft" in numbers["explanation"]


# --- what the run report reads the setting from ----------------------------------------------------------


def test_think_mode_is_the_override_else_the_envs_default_else_unknown():
    assert audit_report.think_mode({"env": {"name": "frozen_lake", "overrides": {"require_think": False}}}) is False
    assert audit_report.think_mode({"env": {"name": "sokoban"}}) is True  # the registered default
    assert audit_report.think_mode({"env": {"name": "nosuch.module:Env"}}) is None
    assert Setting.of({"model": "SmolLM2", "max_turns": 5}).bundled and Setting.of({"max_turns": 5}).multi_turn
    assert not Setting.of({"model": HUB}).bundled and not Setting.of({}).multi_turn


def test_the_run_report_advises_from_the_runs_own_config(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "rollout/success_rate": 0.0, "rollout/in_group_reward_std_mean": 0.0,
             "rollout/format_ok_fraction": 0.1} for s in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("model: {name: bundled}\nenv: {name: frozen_lake, overrides: "
                                     "{require_think: false}}\nrollout: {max_turns: 3, group_size: 4}\n")
    summary = audit_report.build_report(run, tmp_path / "audit")["data"]
    assert (summary["config"]["think_mode"], summary["config"]["max_turns"]) == (False, 3)
    text = "\n".join(summary["verdict"]["lines"])
    assert "ragen2 demos --env frozen_lake --reasoning none --out demos.jsonl rollout.max_turns=3" in text
    assert "group_size=8" not in text and "Train in think mode" not in text
