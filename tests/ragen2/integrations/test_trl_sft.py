"""A `ragen2 demos` file trains in TRL 1.16's real SFTTrainer (issue 49, item 4), loaded as the
JSONL it is, with `assistant_only_loss` and ragen2's training chat template: TRL's labels are
exactly the rollout's response mask (what `ragen2 sft` and an RL update train), and one step's loss
is the token-mean NLL over those tokens alone. Skipped when TRL is not installed (the trl extra)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaForCausalLM

from ragen2 import demos as demos_lib
from ragen2.algos import losses
from ragen2.config import load_config
from ragen2.engines.local import learner
from ragen2.engines.local.sft import demo_rows
from ragen2.integrations.trl.sft import training_chat_template
from ragen2.models import SMOLLM2_CHAT_TEMPLATE
from tests.tiny import build_tiny_tokenizer, tiny_model_config

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def trl():
    with warnings.catch_warnings():  # importing TRL installs warning filters; keep them to this module
        return pytest.importorskip("trl")


def _demos(env: str, reasoning: str) -> list[dict]:
    settings = demos_lib.settings_for(reasoning, {})
    spec = demos_lib.DemoSpec(env, demos_lib.env_args_of(env, settings), max_turns=5, max_response_words=100)
    return [demos_lib.render_demo(spec, seed, 0, reasoning) for seed in SEEDS]


def _model(tokenizer) -> LlamaForCausalLM:
    config = tiny_model_config(tokenizer)
    config.initializer_range = 0.5  # far from uniform: token losses differ, so a wrong mask shows in the loss
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _trainer(trl, tmp_path, demos):
    from datasets import load_dataset

    path = tmp_path / "demos.jsonl"
    demos_lib.write_demos(path, demos)
    tokenizer = build_tiny_tokenizer()  # SmolLM2's template, bytes: the rollout's ids are the template's ids
    tokenizer.chat_template = training_chat_template(tokenizer.chat_template)
    data = load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), assistant_only_loss=True, max_length=None,
                         per_device_train_batch_size=len(demos), max_steps=1, learning_rate=1e-3,
                         lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none",
                         use_cpu=True, bf16=False, gradient_checkpointing=False, disable_tqdm=True, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL warns that <|im_end|> is outside the loss: meant, see the module
        return trl.SFTTrainer(model=_model(tokenizer), args=args, train_dataset=data, processing_class=tokenizer)


def _rollout_rows(demos, tokenizer):
    cfg = load_config(env=demos[0]["env"], overrides=["rollout.max_new_tokens=400", "rollout.max_context_tokens=8192"])
    return demo_rows(demos, tokenizer, cfg)


def _collated(trainer, demos):
    """TRL's own batch of the demos, in file order (the collator the trainer trains with)."""
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(demos))])


@pytest.mark.parametrize("env,reasoning", [("frozen_lake", "grounded"), ("sokoban", "none")])
def test_trl_labels_are_the_rollouts_response_mask(trl, tmp_path, env, reasoning):
    demos = _demos(env, reasoning)
    trainer = _trainer(trl, tmp_path, demos)
    batch = _collated(trainer, demos)
    rows = _rollout_rows(demos, build_tiny_tokenizer())
    tokenizer = trainer.processing_class
    for i, demo in enumerate(demos):
        labels = batch["labels"][i]
        ids = batch["input_ids"][i]
        width = int(rows.attention_mask[i].sum())
        # The rollout's row ends at its last sampled token; TRL's goes on to the final "<|im_end|>\n".
        assert torch.equal(ids[:width], rows.input_ids[i, :width])
        assert torch.equal(labels[:width] != -100, rows.response_mask[i, :width].bool())
        assert not (labels[width:] != -100).any()
        # Read as text: the assistant messages after their prefilled tag, and nothing of system/user turns.
        trained = tokenizer.decode(ids[labels != -100])
        tag = demos_lib.prefill_of(demo)
        assert trained == "".join(text[len(tag):] for text in demos_lib.assistant_texts(demo))
    # The training template writes the same text as the rollout's.
    for demo in demos:
        assert (tokenizer.apply_chat_template(demo["messages"], tokenize=False)
                == tokenizer.apply_chat_template(demo["messages"], tokenize=False, chat_template=SMOLLM2_CHAT_TEMPLATE))


def test_one_sft_trainer_step_trains_on_assistant_tokens_only(trl, tmp_path):
    demos = _demos("frozen_lake", "grounded")
    trainer = _trainer(trl, tmp_path, demos)
    model = trainer.model
    rows = _rollout_rows(demos, trainer.processing_class)
    mask = rows.response_mask
    with torch.no_grad():  # ragen2's SFT loss (losses.sft_loss) on the rollout's rows, before the step
        log_probs, _ = learner.policy_log_probs(model, learner.TokenRows(rows.input_ids, rows.attention_mask, mask))
        ours = float(losses.sft_loss(log_probs, mask, total_tokens=int(mask.sum())))
        every_token = rows.input_ids.masked_fill(rows.attention_mask == 0, -100)
        everything = float(model(input_ids=rows.input_ids, attention_mask=rows.attention_mask, labels=every_token).loss)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert trainer.state.global_step == 1
    # TRL's step loss is ours (unrounded in log_history; the two differ by float rounding, ~1e-5):
    # the same tokens. Training the prefilled tags too, or every token, moved it by hundredths in trials.
    assert logged["loss"] == pytest.approx(ours, abs=1e-4)
    assert abs(everything - ours) > 1e-2  # the control: another mask is far outside that tolerance
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_module_command_writes_a_model_ragen2_takes(trl, tmp_path, capsys):
    from ragen2.integrations.trl.sft import main, renders_as_smollm2
    from ragen2.models import check_model_source, load_policy, load_tokenizer

    tokenizer = build_tiny_tokenizer()
    source = tmp_path / "tiny"
    _model(tokenizer).save_pretrained(source)
    tokenizer.save_pretrained(source)
    demos = tmp_path / "demos.jsonl"
    demos_lib.write_demos(demos, _demos("frozen_lake", "grounded"))
    out = tmp_path / "trl-sft"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["--demos", str(demos), "--out", str(out), "--model", str(source), "--steps", "1", "--batch", "3"])
    assert code == 0
    assert f"next: ragen2 train --env frozen_lake --model {out}" in capsys.readouterr().err
    assert check_model_source(out) == "local"
    saved = load_tokenizer(str(out))
    assert renders_as_smollm2(saved.chat_template)  # the plain template again: prompts as before training
    trained = load_policy(str(out))
    assert any(not torch.equal(a, b) for a, b in zip(_model(tokenizer).state_dict().values(),
                                                     trained.state_dict().values()))


def test_the_module_command_refuses_a_bad_file_or_template_in_one_line(trl, tmp_path, capsys):
    from ragen2.integrations.trl.sft import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["--demos", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "empty" in capsys.readouterr().err
    with pytest.raises(ValueError, match="get_training_chat_template"):
        training_chat_template("{{ messages[0]['content'] }}")


def test_without_the_prefill_tag_whole_assistant_messages_are_marked():
    """For RL with rollout.prefill_tag=false, where the model writes the tag itself."""
    demo = _demos("sokoban", "grounded")[0]
    tokenizer = build_tiny_tokenizer()
    out = tokenizer.apply_chat_template(demo["messages"], chat_template=training_chat_template(prefill=False),
                                        tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    marked = [token for token, on in zip(out["input_ids"], out["assistant_masks"]) if on]
    assert tokenizer.decode(marked) == "".join(demos_lib.assistant_texts(demo))
