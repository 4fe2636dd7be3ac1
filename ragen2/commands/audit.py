"""`ragen2 audit RUN_DIR` (HTML report + JSON summary, ragen2.reports.audit_report) and
`ragen2 audit --model PATH_OR_ID --env NAME` (fresh rollouts probed, a verdict; ragen2.reports.audit)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import get_args

import envs
from ragen2 import metric_names as names
from ragen2.commands import COMMANDS
from ragen2.config import ProbeSection
from ragen2.presets import key_values
from ragen2.reports.audit_verdict import AuditSettings
from ragen2.run_dir import AUDIT_DIR, CONFIG_FILE


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit", help=COMMANDS["audit"],
        description="ragen2 audit RUN_DIR writes an HTML report and a JSON summary; "
                    "ragen2 audit --model PATH_OR_ID --env NAME probes fresh rollouts and prints a verdict.")
    parser.add_argument("run_dir", nargs="*", type=Path, metavar="RUN_DIR",
                        help="a ragen2 run directory to report on (or use --model instead); several: the proxies' "
                             "correlations with the target side by side per run and across runs")
    parser.add_argument("--out", type=Path, help=f"report folder (default RUN_DIR/{AUDIT_DIR})")
    parser.add_argument("--target", default=names.ROLLOUT_SUCCESS_RATE,
                        help="metric the proxies are rank-correlated with (default rollout/success_rate)")
    parser.add_argument("--model", help="model to probe instead of a run: bundled | hub id | model dir | run dir | "
                                        "checkpoints/step_N[/policy]")
    parser.add_argument("--env", help="env to roll out (default: the checkpoint's run env, else bandit)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env config override, repeatable (e.g. --env-arg dim_x=8)")
    helps = {"groups": "instances (prompts) to roll out; more gives more reasoning rows",
             "group_size": "rollouts per instance", "max_turns": "turns per rollout",
             "max_new_tokens": "tokens per turn (the reasoning must close within them)",
             "temperature": "sampling temperature", "mode": "first_turn: reasoning of turn 1 against every "
             "instance's first prompt; trajectory: any turn against the other contexts",
             "segment": "what is scored under the prompts: reasoning (between <think> and </think>, RAGEN-2) or "
             "reply (every token of the turn; a row for every rollout, also in answer-only mode); auto: reasoning where "
             "the env requires <think>, else reply",
             "num_samples": "most (reasoning, prompt) rows the probe scores", "seed": "seed of instances and sampling"}
    for name, default in asdict(AuditSettings()).items():
        flag = "--" + name.replace("_", "-")
        text = f"{helps[name]} (default {default})"
        if name in ("mode", "segment"):  # the probe's own settings: their choices are the config's
            parser.add_argument(flag, default=default, choices=get_args(ProbeSection.model_fields[name].annotation),
                                help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    parser.add_argument("--compare-base", action="store_true",
                        help=f"for a checkpoint: also audit the base model named in its {CONFIG_FILE} on the same "
                             "instances and print the differences (twice the time)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--json", type=Path, help="also write the model audit's (or several runs') numbers here")
    parser.set_defaults(run=run)


def run(args) -> int:
    runs = args.run_dir
    args.run_dir = runs[0] if len(runs) == 1 else (None if not runs else runs)
    if args.run_dir is None and args.model is None:
        print("error: give RUN_DIR (report on a run: ragen2 audit runs/NAME) or --model (probe a model: "
              "ragen2 audit --model bundled --env bandit)", file=sys.stderr)
        return 2
    if args.run_dir is not None and args.model is not None:
        print("error: give RUN_DIR or --model, not both (--model runs/NAME probes that run's latest checkpoint)",
              file=sys.stderr)
        return 2
    try:
        if isinstance(args.run_dir, list):
            return _runs(args)
        return _report(args) if args.run_dir is not None else _model_audit(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _report(args) -> int:
    from ragen2.reports.audit_report import build_report  # torch, scipy and matplotlib: not for --help

    result = build_report(args.run_dir, args.out, args.target)
    data = result["data"]
    alerts = data["alerts"]
    print(f"wrote {result['html']} and {result['summary']}")
    print(f"verdict: {data['verdict']['label']}" + "".join(f"\n  {line}" for line in data["verdict"]["lines"]))
    print(f"  {len(alerts)} alert(s)" + "".join(f"\n  step {a['step'] + 1}: {a['message']}" for a in alerts))
    for entry in result["data"]["spearman"]:
        if entry["rho"] is not None:
            print(f"  Spearman({entry['proxy']}, {args.target}) = {entry['rho']:+.3f} (n={entry['n']})")
    return 0


def _runs(args) -> int:
    from ragen2.reports.audit_runs import audit_runs, render  # scipy: not for --help

    result = audit_runs(args.run_dir, args.target)
    print(render(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


def _env_factory(name: str, typed: dict, raw_overrides: list[str]):
    """An env builder: `typed` overrides (a run's config) then `KEY=VALUE` strings from the command line."""
    entry = envs.spec(name)
    raw = key_values(raw_overrides, "--env-arg", "--env-arg dim_x=8")
    config = entry.make_config(**{**typed, **envs.coerce_overrides(entry, raw)})
    return lambda: entry.env_cls(config)


def _model_audit(args) -> int:
    from ragen2.reports import audit  # torch and transformers: not for --help or a run's report
    from ragen2.models import ModelSourceError, ModelWeightsError

    try:
        spec = audit.resolve_model(args.model)
        run_env = (spec.run_config or {}).get("env", {})
        env_name = args.env or run_env.get("name") or "bandit"
        # the run's env settings apply when auditing on the run's own env
        typed = (run_env.get("overrides") or {}) if env_name == run_env.get("name") else {}
        factory = _env_factory(env_name, typed, args.env_arg)
        print(f"loading {args.model} ...", file=sys.stderr)
        policy, tokenizer = audit.load_model(spec, args.device)
    except (ModelSourceError, ModelWeightsError, envs.EnvConfigError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    settings = AuditSettings(**{name: getattr(args, name) for name in asdict(AuditSettings())})
    print(f"rolling out {settings.groups} groups x {settings.group_size} on {env_name} ...", file=sys.stderr)
    numbers = audit.audit_model(policy, tokenizer, factory, settings)
    numbers.update(model=args.model, env=env_name)  # before the verdict: its advice depends on them
    label, explanation = audit.verdict(numbers)
    numbers.update(verdict=label, explanation=explanation)
    print(f"verdict: {label}\n  {explanation}")
    degenerate = numbers.get("degenerate_fraction")  # every audit_model counts them; a caller's numbers may not
    print(f"  success {numbers['success_rate']:.3f} | format ok {numbers['format_ok_fraction']:.3f} | "
          f"turns with reasoning {numbers['think_span_fraction']:.3f}"
          + ("" if degenerate is None else f" | degenerate replies {degenerate:.3f}"))
    if args.compare_base:
        if spec.weights is None:
            print("  --compare-base: not a checkpoint, so there is no base model to compare with")
        else:
            base_name = spec.run_config.get("model", {}).get("name", "bundled")
            print(f"auditing the base model {base_name} on the same instances ...", file=sys.stderr)
            base_policy, _ = audit.load_model(audit.ModelSpec(spec.source), args.device)
            base = audit.audit_model(base_policy, tokenizer, factory, settings)
            numbers["base"] = {**base, "verdict": audit.verdict(base)[0]}
            print(f"  {audit.compare_with_base(numbers, base)}")
    if args.json is not None:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 0
