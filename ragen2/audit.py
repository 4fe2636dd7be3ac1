"""`ragen2 audit`: template-collapse diagnostics for a finished run, or for any model.

    ragen2 audit RUN_DIR [--out DIR]              HTML report + JSON summary (see audit_report.py)
    ragen2 audit --model PATH_OR_ID --env NAME    roll out fresh groups, probe them, print a verdict

`--model` takes "bundled", a hub id, a saved Hugging Face model directory, or a ragen2
checkpoint: a run directory (its latest checkpoint), `checkpoints/step_N`, or
`step_N/policy`. A checkpoint is the base model named in the run's config.yaml (with its
LoRA adapters, if the run used them) plus the saved weights.

The verdict reads two things: does the reasoning identify its own prompt better than
chance (retrieval accuracy@1 against 1/N, as a z-score over the rows), and is the
reasoning still varied (policy token entropy). Varied reasoning that does not identify
its input is template collapse, but only with enough rows from a model that mostly writes
the format; otherwise the verdict is "inconclusive" and says what to change. The exact
rules are in `audit_verdict.py`. `--compare-base` audits a checkpoint's base model on the
same instances and prints the differences.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ragen2.audit_verdict import compare_with_base, model_verdict, retrieval_zscore, run_verdict  # noqa: F401
from ragen2.run_dir import CONFIG_FILE, POLICY_DIR, read_config
from ragen2.seeding import audit_seeds


@dataclass
class AuditSettings:
    groups: int = 8
    group_size: int = 4
    max_turns: int = 1
    max_new_tokens: int = 96
    temperature: float = 1.0
    mode: str = "first_turn"
    num_samples: int = 64
    seed: int = 0


@dataclass
class ModelSpec:
    source: str  # what `from_pretrained` loads: bundled cache dir, model dir or hub id
    weights: Path | None = None  # a ragen2 `save_model` folder loaded on top
    run_config: dict | None = None  # the run's config.yaml, when the model is a checkpoint


# --- loading a model -------------------------------------------------------------------------


def _run_config_above(path: Path) -> dict | None:
    for folder in [path, *path.parents][:5]:
        config = read_config(folder)
        if config is not None:
            return config
    return None


def resolve_model(spec: str) -> ModelSpec:
    """Where the weights of `spec` come from (see the module doc for what it accepts)."""
    from ragen2 import checkpoint as ckpt
    from ragen2 import models as model_lib

    path = Path(spec).expanduser()
    weights = None
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / model_lib.WEIGHTS_FILE).is_file():
            weights = path  # step_N/policy
        elif (path / POLICY_DIR / model_lib.WEIGHTS_FILE).is_file():
            weights = path / POLICY_DIR  # step_N
        elif (path / CONFIG_FILE).is_file():
            latest = ckpt.latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(f"{path} is a run directory without a complete checkpoint")
            weights = latest / POLICY_DIR
        else:
            raise FileNotFoundError(f"{path}: neither a model directory (config.json), a ragen2 checkpoint "
                                    f"({POLICY_DIR}/{model_lib.WEIGHTS_FILE}) nor a run directory ({CONFIG_FILE})")
    if weights is None:
        return ModelSpec(model_lib.resolve_model_source(spec))
    run_config = _run_config_above(weights)
    if run_config is None:
        raise FileNotFoundError(f"{weights}: found no {CONFIG_FILE} above it naming the base model")
    base = run_config.get("model", {}).get("name", model_lib.DEFAULT_MODEL)
    return ModelSpec(model_lib.resolve_model_source(base), weights, run_config)


def load_model(spec: ModelSpec, device: str = "cpu"):
    """(policy, tokenizer) for a resolved spec; a checkpoint's weights are loaded on top."""
    from ragen2 import models as model_lib

    model_cfg = (spec.run_config or {}).get("model", {})
    lora = None
    if spec.weights is not None and int(model_cfg.get("lora_rank", 0)) > 0:
        lora = model_lib.LoraSettings(rank=int(model_cfg["lora_rank"]), alpha=int(model_cfg.get("lora_alpha", 16)),
                                      dropout=float(model_cfg.get("lora_dropout", 0.0)))
    tokenizer = model_lib.load_tokenizer(spec.source)
    policy = model_lib.load_policy(spec.source, dtype=model_cfg.get("dtype", "float32"), device=device, lora=lora)
    if spec.weights is not None:
        model_lib.load_model_weights(policy, spec.weights)
    return policy.eval(), tokenizer


# --- measuring ---------------------------------------------------------------------------------


def policy_entropy(policy, batch, temperature: float, micro_batch_size: int = 4) -> float:
    """Mean entropy (nats) of the policy's next-token distribution over every sampled token."""
    import torch

    from ragen2.engines import local

    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(batch), micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            mask = batch.response_mask[rows]
            _, entropy = local.policy_log_probs(policy, batch.input_ids[rows], batch.attention_mask[rows], mask,
                                                temperature, with_entropy=True)
            total += float((entropy * mask).sum())
            count += int(mask.sum())
    return total / count if count else float("nan")


def audit_model(policy, tokenizer, env_factory, settings: AuditSettings) -> dict:
    """Roll out fresh groups, cross-score their reasoning, and return the numbers."""
    import torch

    from ragen2.config import ProbeSection
    from ragen2.probe import Probe
    from ragen2.rollout import RolloutConfig, rollout

    seeds = audit_seeds(settings.seed, settings.groups)
    config = RolloutConfig(group_size=settings.group_size, max_turns=settings.max_turns,
                           max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    batch = rollout(policy, tokenizer, env_factory, seeds, config, torch.Generator().manual_seed(settings.seed))
    probe = Probe(ProbeSection(every=1, num_samples=max(2, settings.num_samples), mode=settings.mode), tokenizer)
    numbers = {key.split("/", 1)[1]: value for key, value in probe.measure(policy, batch, settings.seed).items()}
    rollout_metrics = batch.metrics()
    numbers.update(policy_entropy=policy_entropy(policy, batch, settings.temperature),
                   success_rate=rollout_metrics["rollout/success_rate"],
                   reward_mean=rollout_metrics["rollout/reward_mean"],
                   think_span_fraction=rollout_metrics["rollout/think_span_fraction"],
                   format_ok_fraction=rollout_metrics["rollout/format_ok_fraction"],
                   num_trajectories=rollout_metrics["rollout/num_trajectories"])
    return numbers


def verdict(numbers: dict) -> tuple[str, str]:
    """(label, explanation) from `audit_model`'s numbers; the rule is `audit_verdict.model_verdict`."""
    return model_verdict(numbers)


# --- the command -------------------------------------------------------------------------------


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "audit", help="collapse diagnostics: HTML report for a run, or a verdict for any model",
        description="ragen2 audit RUN_DIR writes an HTML report and a JSON summary; "
                    "ragen2 audit --model PATH_OR_ID --env NAME probes fresh rollouts and prints a verdict.")
    parser.add_argument("run_dir", nargs="?", type=Path, metavar="RUN_DIR",
                        help="a ragen2 run directory to report on (or use --model instead)")
    parser.add_argument("--out", type=Path, help="report folder (default RUN_DIR/audit)")
    parser.add_argument("--target", default="rollout/success_rate",
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
             "num_samples": "most (reasoning, prompt) rows the probe scores", "seed": "seed of instances and sampling"}
    for name, default in asdict(AuditSettings()).items():
        flag = "--" + name.replace("_", "-")
        text = f"{helps[name]} (default {default})"
        if name == "mode":
            parser.add_argument(flag, default=default, choices=("first_turn", "trajectory"), help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    parser.add_argument("--compare-base", action="store_true",
                        help="for a checkpoint: also audit the base model named in its config.yaml on the same "
                             "instances and print the differences (twice the time)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--json", type=Path, help="also write the model audit's numbers here")
    parser.set_defaults(run=run_audit)


def run_audit(args) -> int:
    if args.run_dir is None and args.model is None:
        print("error: give RUN_DIR (report on a run: ragen2 audit runs/NAME) or --model (probe a model: "
              "ragen2 audit --model bundled --env bandit)", file=sys.stderr)
        return 2
    if args.run_dir is not None and args.model is not None:
        print("error: give RUN_DIR or --model, not both (--model runs/NAME probes that run's latest checkpoint)",
              file=sys.stderr)
        return 2
    try:
        return _report(args) if args.run_dir is not None else _model_audit(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _report(args) -> int:
    from ragen2.audit_report import build_report

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


def _env_factory(name: str, typed: dict, raw_overrides: list[str]):
    """An env builder: `typed` overrides (a run's config) then `KEY=VALUE` strings from the command line."""
    import envs

    entry = envs.spec(name)
    raw = {}
    for item in raw_overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg {item!r} is not KEY=VALUE")
        raw[key] = value
    config = entry.make_config(**{**typed, **envs.coerce_overrides(entry, raw)})
    return lambda: entry.env_cls(config)


def _model_audit(args) -> int:
    import envs

    from ragen2.models import ModelSourceError, ModelWeightsError

    try:
        spec = resolve_model(args.model)
        run_env = (spec.run_config or {}).get("env", {})
        env_name = args.env or run_env.get("name") or "bandit"
        # the run's env settings apply when auditing on the run's own env
        typed = (run_env.get("overrides") or {}) if env_name == run_env.get("name") else {}
        factory = _env_factory(env_name, typed, args.env_arg)
        print(f"loading {args.model} ...", file=sys.stderr)
        policy, tokenizer = load_model(spec, args.device)
    except (ModelSourceError, ModelWeightsError, envs.EnvConfigError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    settings = AuditSettings(**{name: getattr(args, name) for name in asdict(AuditSettings())})
    print(f"rolling out {settings.groups} groups x {settings.group_size} on {env_name} ...", file=sys.stderr)
    numbers = audit_model(policy, tokenizer, factory, settings)
    label, explanation = verdict(numbers)
    numbers.update(verdict=label, explanation=explanation, model=args.model, env=env_name)
    print(f"verdict: {label}\n  {explanation}")
    print(f"  success {numbers['success_rate']:.3f} | format ok {numbers['format_ok_fraction']:.3f} | "
          f"turns with reasoning {numbers['think_span_fraction']:.3f}")
    if args.compare_base:
        if spec.weights is None:
            print("  --compare-base: not a checkpoint, so there is no base model to compare with")
        else:
            base_name = spec.run_config.get("model", {}).get("name", "bundled")
            print(f"auditing the base model {base_name} on the same instances ...", file=sys.stderr)
            base_policy, _ = load_model(ModelSpec(spec.source), args.device)
            base = audit_model(base_policy, tokenizer, factory, settings)
            numbers["base"] = {**base, "verdict": verdict(base)[0]}
            print(f"  {compare_with_base(numbers, base)}")
    if args.json is not None:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m ragen2.audit ...`, the same as `ragen2 audit ...`."""
    import argparse

    parser = argparse.ArgumentParser(prog="ragen2")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
