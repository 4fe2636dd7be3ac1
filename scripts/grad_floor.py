"""How big is a "zero" task gradient? The float32 residue of a group whose replies are identical but
whose rewards differ (Bandit's random payoff): mean-centred advantages sum to zero over one and the
same reply, so the group's task gradient is zero in exact arithmetic; whatever norm the float32
computation leaves is rounding. Measured through the decomposition's own code path
(grad_decomp.bucket_gradients: the update's loss, Dr.GRPO's seq-mean-token-sum, old = current
log-probs), the same rows in float32 and in float64, each against the group's uncancelled scale
(the same rows with |advantage|: the norm the group would have if its replies differed).

    python scripts/grad_floor.py [--model tiny|bundled] [--out docs/benchmarks/grad_floor.json]

`tiny` is tests/tiny.py's random tiny Llama (seconds); `bundled` is SmolLM2-135M (minutes). The float64
column keeps the head's log-softmax in float32 (learner.policy_log_probs holds log-probs in float32), so its
residue is not 1e-16 but an order of magnitude under float32's: it follows the precision, as rounding does.
scripts/grad_vs_spread.py's FLOOR_RELATIVE rests on the ratio this prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.tiny, when run as a script

from mi_probe import gradients as grad_lib  # noqa: E402
from ragen2.algos.advantages import dr_grpo_advantages  # noqa: E402
from ragen2.config import Config  # noqa: E402
from ragen2.engines.local import grad_decomp, learner  # noqa: E402

PROMPT = ("<|im_start|>system\nYou're a helpful assistant. <|im_end|>\n<|im_start|>user\nYou are playing a "
          "bandit game. Goal: maximize your reward. Choose Teacher or Trader.<|im_end|>\n<|im_start|>assistant\n")
REPLY = "<answer>Trader</answer><|im_end|>"


def load(kind: str):
    if kind == "tiny":
        from tests.tiny import tiny_llama, tiny_tokenizer

        tokenizer = tiny_tokenizer("chatml")
        return tiny_llama(tokenizer, seed=0).float(), tokenizer
    from ragen2.models import DEFAULT_MODEL, resolve_model_source
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_source(DEFAULT_MODEL)
    return (AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32),
            AutoTokenizer.from_pretrained(source))


def group_norms(policy, ids: torch.Tensor, reply_tokens: int, rewards: list[float], dtype) -> tuple[float, float]:
    """(task norm with mean-centred advantages, with their absolute values) for one group of identical rows."""
    cfg = Config(algo={"loss_agg": "seq-mean-token-sum", "kl_coef": 0.0},
                 optim={"micro_batch_size": len(rewards)})
    policy = policy.to(dtype)
    rows = ids.expand(len(rewards), -1).contiguous()
    attn = torch.ones_like(rows)
    mask = torch.zeros(rows.shape, dtype=dtype)
    mask[:, -reply_tokens:] = 1.0
    token_rewards = torch.zeros(rows.shape, dtype=dtype)
    token_rewards[:, -1] = torch.tensor(rewards, dtype=dtype)
    adv = dr_grpo_advantages(token_rewards, mask, torch.zeros(len(rewards), dtype=torch.long))
    with torch.no_grad():
        old, _ = learner.policy_log_probs(policy, learner.TokenRows(rows, attn, mask))
    norms = []
    for advantages in (adv, adv.abs()):
        data = learner.UpdateInputs(rows, attn, mask, old.detach(), advantages.contiguous())
        components = grad_decomp.bucket_gradients(policy, cfg, data, list(range(len(rewards))))[0]
        norms.append(grad_lib.norm(components["task"]))
    return norms[0], norms[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "bundled"), default="tiny")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/grad_floor.json"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    policy, tokenizer = load(args.model)
    policy.train()
    prompt, reply = tokenizer(PROMPT)["input_ids"], tokenizer(REPLY)["input_ids"]
    ids = torch.tensor([prompt + reply])
    generator = torch.Generator().manual_seed(0)
    trials = []
    for trial in range(8):  # rewards as Bandit pays them: per episode, so identical replies still differ
        rewards = (torch.rand(4, generator=generator) * (1 + trial)).tolist()
        row = {"rewards": rewards}
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            cancelled, scale = group_norms(policy, ids, len(reply), rewards, dtype)
            row[name] = {"task_norm": cancelled, "uncancelled_norm": scale, "ratio": cancelled / scale}
        trials.append(row)
    worst = {name: max(t[name]["ratio"] for t in trials) for name in ("float32", "float64")}
    result = {"command": "python scripts/grad_floor.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "model": args.model, "reply_tokens": len(reply), "prompt_tokens": len(prompt),
              "group_size": 4, "eps_float32": float(torch.finfo(torch.float32).eps),
              "max_ratio": worst, "trials": trials}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for t in trials:
        print(" ".join(f"{n}: {t[n]['task_norm']:.3g} of {t[n]['uncancelled_norm']:.3g} ({t[n]['ratio']:.2g})"
                       for n in ("float32", "float64")))
    print(f"largest residue / uncancelled norm: float32 {worst['float32']:.3g}, float64 {worst['float64']:.3g}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
