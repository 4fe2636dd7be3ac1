"""`ragen2 export`: a checkpoint becomes a folder that AutoModelForCausalLM.from_pretrained loads,
with the same logits as the checkpoint's policy (plain, LoRA merged, LoRA as an adapter)."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen2.engines.local import checkpoint as ckpt
from ragen2 import models as model_lib
from ragen2.cli import main
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def _run(tmp_path, tok, policy, lora_rank=0, step=2):
    """A run directory: config.yaml naming a saved tiny base, one complete checkpoint of `policy`."""
    base = tmp_path / "base"
    if not base.exists():
        tiny_llama(tok, seed=0).save_pretrained(base)
        tok.save_pretrained(base)
    run = tmp_path / "run"
    folder = run / "checkpoints" / f"step_{step:06d}"
    model_lib.save_model(policy, folder / "policy")
    (folder / ckpt.STATE_FILE).write_text('{"step": %d}' % step)
    (run / "config.yaml").write_text(f"model: {{name: {base}, lora_rank: {lora_rank}, lora_alpha: 16}}\n"
                                     "env: {name: bandit}\n")
    return run


def _logits(model, tok):
    ids = tok("<|im_start|>user\nwhich arm?<|im_end|>", return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


def test_export_of_a_full_checkpoint_loads_with_the_same_logits(tmp_path, tok, capsys):
    trained = tiny_llama(tok, seed=1)  # differs from the base: export must take the checkpoint's weights
    run = _run(tmp_path, tok, trained)
    assert main(["export", str(run)]) == 0
    out = run / "export" / "step_000002"
    assert f"wrote {out}" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(_logits(loaded, tok), _logits(trained, tok))
    assert AutoTokenizer.from_pretrained(out)("hi")["input_ids"] == tok("hi")["input_ids"]
    # a non-empty target is refused, not overwritten
    assert main(["export", str(run)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_exported_files_are_readable_by_others(tmp_path, tok):
    # model.safetensors came out 0600 (save_pretrained's temporary file), unlike every other file
    run = _run(tmp_path, tok, tiny_llama(tok, seed=1))
    previous = os.umask(0o022)
    try:
        assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def _lora_policy(tok):
    policy = model_lib.apply_lora(tiny_llama(tok, seed=0), model_lib.LoraSettings(rank=4, alpha=16))
    with torch.no_grad():  # trained adapters: B is zero at init, which would make LoRA a no-op
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(7)) * 0.5)
    return policy.eval()


def test_export_of_a_lora_checkpoint_merged_and_as_an_adapter(tmp_path, tok):
    policy = _lora_policy(tok)
    run = _run(tmp_path, tok, policy, lora_rank=4)
    want = _logits(policy, tok)
    assert not torch.allclose(want, _logits(tiny_llama(tok, seed=0), tok))  # the adapters matter
    assert main(["export", str(run), "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    # W + BA summed once in fp32 rounds differently from adding BA's output: ~2e-5 on logits of size ~4
    assert torch.allclose(_logits(merged, tok), want, atol=1e-4)
    assert main(["export", str(run), "--out", str(tmp_path / "adapter"), "--lora", "adapter"]) == 0
    names = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
    adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")  # transformers reads the adapter's base
    assert torch.allclose(_logits(adapter, tok), want, atol=1e-5)


def test_export_picks_a_checkpoint_and_explains_bad_input(tmp_path, tok, capsys):
    run = _run(tmp_path, tok, tiny_llama(tok, seed=1), step=2)
    model_lib.save_model(tiny_llama(tok, seed=2), run / "checkpoints" / "step_000004" / "policy")
    (run / "checkpoints" / "step_000004" / ckpt.STATE_FILE).write_text('{"step": 4}')
    assert main(["export", str(run), "--checkpoint", "step_2", "--out", str(tmp_path / "two")]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "two")
    assert torch.equal(_logits(loaded, tok), _logits(tiny_llama(tok, seed=1), tok))
    capsys.readouterr()
    for argv, message in (([str(run), "--checkpoint", "step_3"], "not among the complete checkpoints"),
                          ([str(run), "--checkpoint", "latest"], "expected step_N"),
                          ([str(run), "--lora", "adapter", "--out", str(tmp_path / "x")], "did not train LoRA"),
                          ([str(tmp_path / "base")], "not a ragen2 run directory")):
        assert main(["export", *argv]) == 2
        assert message in capsys.readouterr().err


# --- checkpoint size: weights-only saves ---------------------------------------------------------


def _training_state(tok, seed):
    from types import SimpleNamespace

    policy = tiny_llama(tok, seed=seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy(**tok("hello", return_tensors="pt")).logits.sum().backward()
    optimizer.step()  # Adam moments now exist: two more tensors per parameter
    return SimpleNamespace(policy=policy, critic=None), SimpleNamespace(actor=optimizer, critic=None)


def test_weights_only_checkpoints_are_smaller_and_resume_says_so(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(ckpt, "_size_reported", set())  # which run dirs printed their size: per test
    models, optimizers = _training_state(tok, seed=3)
    weights = sum(p.numel() * 4 for p in models.policy.parameters())  # fp32 bytes (tied embedding counted once)
    lines = []
    saved = ckpt.Saved(models, optimizers, torch.Generator())
    full = ckpt.save_checkpoint(tmp_path / "full", 1, saved, {}, ckpt.SaveOptions(keep_last=2, report=lines.append))
    ckpt.save_checkpoint(tmp_path / "full", 2, saved, {}, ckpt.SaveOptions(keep_last=2, report=lines.append))
    assert len(lines) == 1 and lines[0].startswith("checkpoint step_000001: ")  # once per run directory
    assert "optimiser state; trainer.save_optimizer=false keeps weights only" in lines[0]
    slim = ckpt.save_checkpoint(tmp_path / "slim", 1, saved, {},
                                ckpt.SaveOptions(keep_last=2, save_optimizer=False, report=lines.append))
    assert "optimiser state" not in lines[1]
    full_sizes, slim_sizes = ckpt._file_sizes(full), ckpt._file_sizes(slim)
    assert full_sizes["policy/model.safetensors"] == slim_sizes["policy/model.safetensors"]
    # Adam keeps exp_avg and exp_avg_sq per parameter: two more copies of the weights
    assert full_sizes[ckpt.OPTIMIZER_FILE] > 2 * weights
    assert slim_sizes[ckpt.OPTIMIZER_FILE] < weights / 10
    fresh_models, fresh_optimizers = _training_state(tok, seed=4)
    fresh_optimizers.actor.state.clear()
    warnings = []
    path, state = ckpt.load_latest(tmp_path / "slim", fresh_models, fresh_optimizers, torch.Generator(),
                                   warnings.append)
    assert path == slim and state["optimizer_saved"] is False
    for mine, theirs in zip(fresh_models.policy.state_dict().values(), models.policy.state_dict().values()):
        assert torch.equal(mine, theirs)
    assert not fresh_optimizers.actor.state  # nothing restored: the moments start from zero
    assert len(warnings) == 1 and "weights only (trainer.save_optimizer=false)" in warnings[0]
    restored = _training_state(tok, seed=4)[1]
    ckpt.load_latest(tmp_path / "full", _training_state(tok, seed=4)[0], restored, torch.Generator(),
                     warnings.append)
    assert len(warnings) == 1 and restored.actor.state  # a full checkpoint restores them, silently
