"""Tiny tokenizers and models built in-process for the tests (no hub, no files; not in the wheel).

`tiny_tokenizer("chatml" | "llama3")` trains a byte-level BPE on a small corpus of RAGEN-style
prompts (so every string round-trips exactly through encode/decode) and attaches a real Jinja
chat template: ChatML as SmolLM2/Qwen write it, or Llama-3's header/eot layout (which trims
message contents). `tiny_llama(tokenizer)` is a randomly initialised LlamaForCausalLM sized to
that vocabulary. `ScriptedPolicy` is a model stand-in whose logits force a scripted answer, so
a rollout's texts, rewards and masks can be checked by hand. `build_tiny_tokenizer` (bytes,
no merges) and `build_tiny_policy` / `build_tiny_value_model` are SmolLM2-shaped models
whose weights depend only on a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers import models as tokenizer_models
from tokenizers.processors import TemplateProcessing
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel, PreTrainedTokenizerFast

from ragen2.models import SMOLLM2_CHAT_TEMPLATE, ValueModel

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama-3's layout: BOS once, a header per message, contents trimmed, <|eot_id|> closes.
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

TEMPLATE_TOKENS = {
    "chatml": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>",
               "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]},
    "llama3": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|end_of_text|>",
               "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eot_id|>"]},
}

_CORPUS = [
    "You're a helpful assistant. You are playing a bandit game. Goal: maximize your reward.",
    "Turn 1:\nState:\nYou have 1 actions left. Always output: <think> [Your thoughts] </think> "
    "<answer> [your answer] </answer> with no extra text. Strictly follow this format.",
    "Reward:\n0.1\nReward:\n-0.1\nReward:\n1\nReward:\n0\n",
    "<think> the risky arm pays more on average </think><answer>Trader</answer>",
    "<think>push the box</think> <answer>Up || Left</answer> Down Right",
    "Your available actions are:\nUp, Down, Left, Right, Teacher, Trader, Nurse, Investor",
    "The quick brown fox jumps over the lazy dog 0123456789 #_O.X@P",
]


def tiny_tokenizer(template: str = "chatml", vocab_size: int = 400):
    """A PreTrainedTokenizerFast with a byte-level BPE and the given chat template layout."""
    if template not in TEMPLATE_TOKENS:
        raise ValueError(f"template must be one of {sorted(TEMPLATE_TOKENS)}, got {template!r}")
    tokens = TEMPLATE_TOKENS[template]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=tokens["specials"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(_CORPUS, trainer=trainer)
    if tokens["bos"] is not None:  # like Llama-3: plain encode() prepends BOS, so doubling would show
        bos = (tokens["bos"], core.token_to_id(tokens["bos"]))
        core.post_processor = TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B", special_tokens=[bos])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=tokens["bos"], eos_token=tokens["eos"], pad_token=tokens["pad"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE if template == "chatml" else LLAMA3_TEMPLATE
    tokenizer.name_or_path = f"tiny-{template}"
    return tokenizer


def tiny_llama(tokenizer, *, seed: int = 0, hidden_size: int = 32, num_layers: int = 2):
    """A random LlamaForCausalLM for `tokenizer`'s vocabulary (fp32, eval mode)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, initializer_range=0.2,  # untied + larger init: varied greedy text
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


# --- a scripted policy ------------------------------------------------------------------------


class _SeenTokens:
    """A stand-in KV cache: the token ids each row has seen, with the cache's batch API."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.ids = self.ids[indices]


@dataclass
class _Output:
    logits: torch.Tensor
    cache: _SeenTokens


class ScriptedPolicy(torch.nn.Module):
    """Forces `respond(prompt_text)` (+ EOS if `end_with_eos`) token by token.

    The prompt text is everything up to the last assistant generation prompt, so the script
    can answer by turn and state. Logits are `margin` on the forced token and 0 elsewhere.
    After the script is exhausted it forces EOS, so generation always ends.
    """

    def __init__(self, tokenizer, respond: Callable[[str], str], *, generation_prompt: str,
                 end_with_eos: bool = False, margin: float = 30.0):
        super().__init__()
        self.tokenizer = tokenizer
        self.respond = respond
        self.generation_prompt = generation_prompt
        self.end_with_eos = end_with_eos
        self.margin = margin
        self.prompts_seen: list[str] = []
        self._scripts: dict[str, list[int]] = {}

    def _script(self, prompt_text: str) -> list[int]:
        if prompt_text not in self._scripts:
            self.prompts_seen.append(prompt_text)
            ids = self.tokenizer.encode(self.respond(prompt_text), add_special_tokens=False)
            if self.end_with_eos:
                ids.append(self.tokenizer.eos_token_id)
            self._scripts[prompt_text] = ids
        return self._scripts[prompt_text]

    def _next_token(self, row: list[int]) -> int:
        # The answer so far is what follows the last generation prompt, found as a token run
        # (prompts are built from token pieces, so re-encoding their text could differ).
        marker = self.tokenizer.encode(self.generation_prompt, add_special_tokens=False)
        starts = [i for i in range(len(row) - len(marker), -1, -1) if row[i:i + len(marker)] == marker]
        if not starts:
            raise ValueError("ScriptedPolicy: no generation prompt in the input")
        answer_start = starts[0] + len(marker)
        script = self._script(self.tokenizer.decode(row[:answer_start], skip_special_tokens=False))
        done = len(row) - answer_start
        return script[done] if done < len(script) else self.tokenizer.eos_token_id

    def forward(self, input_ids, attention_mask=None, cache=None, **_):
        ids = input_ids if cache is None else torch.cat([cache.ids, input_ids], 1)
        mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
        logits = torch.zeros(ids.shape[0], input_ids.shape[1], len(self.tokenizer))
        for b in range(ids.shape[0]):
            row = ids[b][mask[b].bool()].tolist()
            logits[b, -1, self._next_token(row)] = self.margin
        return _Output(logits=logits, cache=_SeenTokens(ids))


# ----------------------------------------------------------------------------- SmolLM2-shaped tiny models


def build_tiny_tokenizer():
    """A byte-level tokenizer (3 ChatML specials + 256 bytes, no merges) with SmolLM2's chat template.

    Ids follow SmolLM2: 0 <|endoftext|> (unk), 1 <|im_start|> (bos), 2 <|im_end|> (eos and pad).
    Any text round-trips; it is built in memory, so tests need no files and no network.
    """
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(specials + alphabet)}
    backend = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=specials[0], bos_token=specials[1],
                                        eos_token=specials[2], pad_token=specials[2])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})  # never split or merged
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def tiny_model_config(tokenizer=None, vocab_size: int = 259, hidden_size: int = 32, num_layers: int = 2,
                      num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 64,
                      max_positions: int = 1024) -> LlamaConfig:
    """A SmolLM2-shaped (Llama, tied embeddings, grouped KV heads) config; vocab and ids from ``tokenizer`` if given."""
    bos, eos, pad = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) if tokenizer else (1, 2, 2)
    return LlamaConfig(vocab_size=len(tokenizer) if tokenizer else vocab_size, hidden_size=hidden_size,
                       intermediate_size=intermediate_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
                       num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def build_tiny_policy(seed: int = 0, config: LlamaConfig | None = None, tokenizer=None) -> LlamaForCausalLM:
    """A tiny LlamaForCausalLM whose random weights depend only on ``seed`` (global RNG untouched)."""
    return _seeded(seed, lambda: LlamaForCausalLM(config or tiny_model_config(tokenizer)))


def build_tiny_value_model(seed: int = 0, config: LlamaConfig | None = None, tokenizer=None) -> ValueModel:
    return _seeded(seed, lambda: ValueModel(LlamaModel(config or tiny_model_config(tokenizer))))


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


# A three-turn Sokoban rollout whose second reply has no reasoning (a format failure).
SCRIPTED_SOKOBAN_REPLIES = {1: "<think>go up</think><answer>Up</answer>", 2: "I refuse",
                            3: "<think>down</think><answer>Down</answer>"}


def scripted_sokoban_batch(tokenizer, generation_prompt: str = "<|im_start|>assistant\n"):
    """Two groups x 2 of three Sokoban turns, each turn's reply taken from SCRIPTED_SOKOBAN_REPLIES."""
    import re

    import envs
    from ragen2.rollout import RolloutConfig, rollout

    def reply(prompt: str) -> str:
        return SCRIPTED_SOKOBAN_REPLIES[int(re.findall(r"Turn (\d+):", prompt)[-1])]

    policy = ScriptedPolicy(tokenizer, reply, generation_prompt=generation_prompt, end_with_eos=True)
    cfg = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=40, prefill_tag=False)
    return rollout(policy, tokenizer, lambda: envs.make("sokoban"), [3, 4], cfg, torch.Generator().manual_seed(0))
