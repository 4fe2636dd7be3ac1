"""Test harness only: the tiny models the end-to-end runs train (saved as HF model directories).

- `random_model`: ragen2's tiny random Llama + ChatML tokenizer. It never closes the answer format,
  so every reward is the format penalty: no reward spread (the SNR skip path).
- `bandit_model`: the same architecture (hidden 64) briefly fine-tuned on
  "<think> the ARM arm </think> <answer>ARM</answer>" replies, either arm at random, after the
  exact prompt ids ragen2's agent builds for Bandit with `instruction_style="explicit"`
  (TokenTrajectory, prefill "<think>"). Sampled at
  T=1 its episodes pick both arms, so groups have reward spread and reasoning spans: the filter
  keeps groups and the MI probe has pairs to score.
- `llama3_model`: a Llama-3 base layout (tokenizer EOS <|end_of_text|>, turns closed by <|eot_id|>,
  which only the generation config lists as an EOS id), fine-tuned to answer every Sokoban turn
  with LLAMA3_REPLY + <|eot_id|>: no "</answer>", so no stop string ends a turn, only the
  generation-config EOS does (the case vLLM reports as finish "stop", stop_reason = the id).
"""
from __future__ import annotations

import random
from pathlib import Path

import torch


def random_model(folder: Path) -> Path:
    from tests.tiny import tiny_llama, tiny_tokenizer

    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def bandit_model(folder: Path, steps: int = 60, seed: int = 0, batch_size: int = 4, lr: float = 5e-3) -> Path:
    import envs
    from envs.prompt import first_turn_messages
    from ragen2.rollout.chat import ChatFormat, TokenTrajectory
    from tests.tiny import tiny_llama, tiny_tokenizer

    rng = random.Random(seed)
    tokenizer = tiny_tokenizer("chatml")
    model = tiny_llama(tokenizer, seed=seed, hidden_size=64, num_layers=2)
    chat = ChatFormat(tokenizer)
    examples = []
    for instance in range(32):
        env = envs.make("bandit", instruction_style="explicit")  # the committed fixture's prompt
        observation, _ = env.reset(seed=instance, options={"rollout_index": 0})
        prompt = TokenTrajectory(chat, list(first_turn_messages(env, observation)), prefill="<think>").input_ids
        for arm in env.action_vocabulary:
            reply = tokenizer(f" the {arm} arm </think> <answer>{arm}</answer>", add_special_tokens=False)["input_ids"]
            examples.append((list(prompt), reply + [tokenizer.eos_token_id]))
    return fine_tune(model, tokenizer, examples, rng, steps, batch_size, lr, folder)


LLAMA3_REPLY = " go up</think> <answer>Up"


def llama3_tokenizer():
    """tests.tiny's Llama-3 chat layout with Llama-3 base's EOS: <|end_of_text|>, not <|eot_id|>."""
    from tests.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer("llama3")
    tokenizer.eos_token = "<|end_of_text|>"
    return tokenizer


def llama3_model(folder: Path, steps: int = 80, seed: int = 0, batch_size: int = 4, lr: float = 5e-3,
                 instances: int = 8, turns: int = 2) -> Path:
    import envs
    from ragen2.rollout.chat import ChatFormat
    from ragen2.rollout.episode import Episode, TurnRules
    from tests.tiny import tiny_llama
    from transformers import GenerationConfig

    rng = random.Random(seed)
    tokenizer = llama3_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    model = tiny_llama(tokenizer, seed=seed, hidden_size=64, num_layers=2)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=[tokenizer.eos_token_id, eot])
    reply = tokenizer(LLAMA3_REPLY, add_special_tokens=False)["input_ids"] + [eot]
    rules = TurnRules(max_turns=turns, max_new_tokens=48, max_context_tokens=4096, max_response_words=100)
    examples = []  # every turn's prompt as the episode builds it after the same reply
    for instance in range(instances):
        episode = Episode(envs.make("sokoban"), ChatFormat(tokenizer), rules, seed=instance)
        episode.reset()
        while (prompt := episode.next_prompt()) is not None:
            examples.append((list(prompt), reply))
            episode.take_reply(reply, [0.0] * len(reply), "eos")
    return fine_tune(model, tokenizer, examples, rng, steps, batch_size, lr, folder)


def fine_tune(model, tokenizer, examples, rng, steps: int, batch_size: int, lr: float, folder: Path) -> Path:
    """Teach `model` the (prompt, reply) pairs (loss on the reply only) and save it with its tokenizer."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        batch = rng.sample(examples, batch_size)
        width = max(len(p) + len(r) for p, r in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (prompt, reply) in enumerate(batch):
            ids[i, :len(prompt) + len(reply)] = torch.tensor(prompt + reply)
            labels[i, len(prompt):len(prompt) + len(reply)] = torch.tensor(reply)
            mask[i, :len(prompt) + len(reply)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
