"""`ragen2 demos` files in TRL's `SFTTrainer` (docs/warm_start.md, "Other trainers").

    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer
    from ragen2.integrations.trl.sft import training_chat_template

    tokenizer.chat_template = training_chat_template(tokenizer.chat_template)
    trainer = SFTTrainer(model=model, processing_class=tokenizer,
                         train_dataset=load_dataset("json", data_files="demos.jsonl", split="train"),
                         args=SFTConfig(assistant_only_loss=True, max_length=None, ...))

A demos file is TRL's conversational format as it stands (`messages` with system/user/assistant
roles; TRL ignores the other fields). What it lacks is in the chat template: TRL's
`assistant_only_loss` reads the `{% generation %}` markers of the template, SmolLM2's ChatML
template (`ragen2.models.SMOLLM2_CHAT_TEMPLATE`) has none, and TRL 1.16 has no training variant of
it (`get_training_chat_template` raises). `SMOLLM2_TRAINING_CHAT_TEMPLATE` is that template with
markers placed where ragen2's rollout puts its response mask, so TRL trains the tokens that
`ragen2 sft` and an RL update of the same trajectory train:

* inside: each assistant message after its prefilled tag (`<think>` or `<answer>`: a rollout puts
  the tag in the prompt, rollout.prefill_tag);
* outside: the tag and the closing `<|im_end|>` (a rollout ends a reply at the `</answer>` stop
  string, so the end-of-turn token is never sampled; TRL warns that it is untrained, which is
  meant here).

It renders exactly the text of SmolLM2's template (markers emit nothing). `prefill=False` marks
whole assistant messages, for rollouts run with rollout.prefill_tag=false.

The same as a command (SmolLM2-family models; writes a model folder `ragen2 train --model` takes):

    python -m ragen2.integrations.trl.sft --demos demos.jsonl --out runs/trl-sft [--model bundled] [--steps 60]
"""

from __future__ import annotations

import argparse
import sys

from envs.parsing import ANSWER_OPEN, THINK_OPEN
from ragen2.models import SMOLLM2_CHAT_TEMPLATE

_SYSTEM_DEFAULT = "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n"


def _template(prefill: bool) -> str:
    # The tag a rollout prefills is prompt: it goes before the generation block, not inside it.
    tag = (f"'{THINK_OPEN}' if content.startswith('{THINK_OPEN}') else "
           f"('{ANSWER_OPEN}' if content.startswith('{ANSWER_OPEN}') else '')") if prefill else "''"
    return (
        "{%- for message in messages %}"
        "{%- if loop.first and message['role'] != 'system' %}"
        "{{- '" + _SYSTEM_DEFAULT + "' }}"
        "{%- endif %}"
        "{%- if message['role'] == 'assistant' %}"
        "{%- set content = message['content'] %}"
        "{%- set tag = " + tag + " %}"
        "{{- '<|im_start|>assistant\\n' + tag }}"
        "{%- generation %}{{- content[tag | length:] }}{%- endgeneration %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


SMOLLM2_TRAINING_CHAT_TEMPLATE = _template(prefill=True)
SMOLLM2_TRAINING_CHAT_TEMPLATE_NO_PREFILL = _template(prefill=False)


# Conversations on which a template must write what SmolLM2's writes to count as SmolLM2's.
_PROBES = (
    [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"},
     {"role": "user", "content": "V"}],
    [{"role": "user", "content": " U\n"}, {"role": "assistant", "content": "<think>t</think><answer>a</answer>"}],
)


def _render(chat_template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers' settings for chat templates; SmolLM2-style templates need no extensions
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def renders_as_smollm2(chat_template: str | None) -> bool:
    """Whether `chat_template` writes SmolLM2's ChatML: the bundled model's tokenizer carries
    SmolLM2's own wording of it, ragen2.models.SMOLLM2_CHAT_TEMPLATE another, with the same output."""
    if not isinstance(chat_template, str):
        return False
    try:
        return all(_render(chat_template, m, g) == _render(SMOLLM2_CHAT_TEMPLATE, m, g)
                   for m in _PROBES for g in (False, True))
    except Exception:  # a template this environment cannot render is not SmolLM2's
        return False


def training_chat_template(chat_template: str | None = SMOLLM2_CHAT_TEMPLATE, prefill: bool = True) -> str:
    """The training template for `chat_template` when it writes SmolLM2's ChatML (the bundled
    model's, ragen2's default); ValueError for any other.

    Another model's template: TRL's own `trl.chat_template_utils.get_training_chat_template`
    knows Qwen, Llama 3 and others; it marks the whole assistant message and its end-of-turn
    token, so the prefilled tag and the end token are trained too."""
    if chat_template in (SMOLLM2_TRAINING_CHAT_TEMPLATE, SMOLLM2_TRAINING_CHAT_TEMPLATE_NO_PREFILL):
        chat_template = SMOLLM2_CHAT_TEMPLATE
    if not renders_as_smollm2(chat_template):
        raise ValueError("training_chat_template knows SmolLM2's ChatML template (ragen2.models.SMOLLM2_CHAT_TEMPLATE); "
                         "for another model use trl.chat_template_utils.get_training_chat_template(tokenizer)")
    return SMOLLM2_TRAINING_CHAT_TEMPLATE if prefill else SMOLLM2_TRAINING_CHAT_TEMPLATE_NO_PREFILL


def main(argv: list[str] | None = None) -> int:
    """TRL's SFTTrainer on a demos file, with `ragen2 sft`'s defaults (8 episodes a step, one per
    micro-batch, AdamW lr 5e-5, clip 1.0); the model folder keeps the plain template."""
    parser = argparse.ArgumentParser(prog="python -m ragen2.integrations.trl.sft",
                                     description="TRL's SFTTrainer on a `ragen2 demos` file, trained on the tokens "
                                                 "ragen2 sft trains; writes a model folder for `ragen2 train --model`")
    parser.add_argument("--demos", required=True, help="a JSONL file written by `ragen2 demos`")
    parser.add_argument("--out", required=True, help="the model folder to write")
    parser.add_argument("--model", default="bundled", help="'bundled' (SmolLM2-135M-Instruct), a hub id or a path")
    parser.add_argument("--steps", type=int, default=60, help="optimiser steps (TRL max_steps)")
    parser.add_argument("--batch", type=int, default=8, help="episodes per optimiser step")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--no-prefill-tag", action="store_true",
                        help="train the <think>/<answer> tag too, for RL with rollout.prefill_tag=false")
    args = parser.parse_args(argv)

    from ragen2.demos import DemosError, read_demos
    from ragen2.models import ModelSourceError, load_tokenizer, resolve_model_source

    try:
        demos = read_demos(args.demos)  # the checks `ragen2 sft` makes, before any model loads
        source = resolve_model_source(args.model)
        tokenizer = load_tokenizer(source, padding_side="right")
        plain = tokenizer.chat_template
        tokenizer.chat_template = training_chat_template(plain, prefill=not args.no_prefill_tag)
    except (DemosError, ModelSourceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    gpu = torch.cuda.is_available()
    config = SFTConfig(output_dir=args.out, assistant_only_loss=True, max_length=None, max_steps=args.steps,
                       per_device_train_batch_size=1, gradient_accumulation_steps=args.batch, learning_rate=args.lr,
                       max_grad_norm=1.0, weight_decay=0.0, gradient_checkpointing=False, use_cpu=not gpu, bf16=gpu,
                       save_strategy="no", report_to="none", logging_steps=1)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32), args=config,
                         train_dataset=load_dataset("json", data_files=str(args.demos), split="train"),
                         processing_class=tokenizer)
    trainer.train()
    tokenizer.chat_template = plain  # the folder prompts exactly as the model it came from
    trainer.save_model(args.out)
    print(f"done: {args.out} | next: ragen2 train --env {demos[0]['env']} --model {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
