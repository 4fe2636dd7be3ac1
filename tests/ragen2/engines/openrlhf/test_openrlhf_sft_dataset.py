"""A `ragen2 demos` file in OpenRLHF 0.11.2's SFT dataset (issue 49, item 4): the `train_sft`
command of docs/warm_start.md, parsed by OpenRLHF's own parser, then the file loaded as `train_sft`
loads it (`blending_datasets` on the .jsonl, `SFTDataset` with those chat-template and multiturn
settings): every demo loads, the ids are the rollout's, and the loss mask covers assistant turns only.

What OpenRLHF trains differs from ragen2's rollout mask at the edges of each turn, and the test
pins that difference: OpenRLHF trains a whole assistant message (the tag a rollout prefills
included) and the template's end of turn `<|im_end|>\\n`; a rollout trains the reply after the
prefilled tag and ends it at the `</answer>` stop string. System and user turns: neither.
Skipped without OpenRLHF (the OpenRLHF CI part installs it; only its datasets module is used, so
no stand-ins are needed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch

pytest.importorskip("openrlhf", reason="openrlhf is not installed: the OpenRLHF engine tests need the OpenRLHF "
                                       "0.11.2 test stack (see .ci/run)")
pytest.importorskip("pylatexenc", reason="openrlhf.utils imports pylatexenc (installed beside openrlhf in .ci/run)")

from openrlhf.datasets import SFTDataset  # noqa: E402
from openrlhf.datasets.utils import blending_datasets  # noqa: E402

from ragen2 import demos as demos_lib  # noqa: E402
from ragen2.config import load_config  # noqa: E402
from ragen2.engines.local.sft import demo_rows  # noqa: E402
from tests.tiny import build_tiny_tokenizer  # noqa: E402

DOC = Path(__file__).resolve().parents[4] / "docs" / "warm_start.md"
COMMAND = "deepspeed --module openrlhf.cli.train_sft"


def recipe_flags() -> list[str]:
    """The flags of the `train_sft` command in docs/warm_start.md (its lines joined at the backslashes)."""
    lines = DOC.read_text()[DOC.read_text().index(COMMAND):].splitlines()
    command = []
    for line in lines:
        command.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(" ".join(command))[len(shlex.split(COMMAND)):]


def parse_train_sft(flags: list[str], monkeypatch):
    """Run the `__main__` block of OpenRLHF 0.11.2's train_sft.py (its argparse and its checks) with
    `train` replaced by a capture, as test_openrlhf_flags does for train_ppo_ray."""
    import argparse
    import ast
    import datetime
    import importlib.util

    source_path = importlib.util.find_spec("openrlhf.cli.train_sft").origin
    tree = ast.parse(Path(source_path).read_text())
    main_block = next(node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    captured = {}
    namespace = {"argparse": argparse, "datetime": datetime.datetime,
                 "train": lambda args: captured.setdefault("args", args)}
    monkeypatch.setattr("sys.argv", ["train_sft.py", *flags])
    exec(compile(ast.Module(body=main_block.body, type_ignores=[]), source_path, "exec"), namespace)
    return captured["args"]


class Strategy:
    """What SFTDataset and blending_datasets read of OpenRLHF's DeepspeedStrategy: args, print, rank."""

    def __init__(self, args):
        self.args = args

    def print(self, *args):
        pass

    def is_rank_0(self) -> bool:
        return True


def _demos(env: str, reasoning: str) -> list[dict]:
    settings = demos_lib.settings_for(reasoning, {})
    spec = demos_lib.DemoSpec(env, demos_lib.env_args_of(env, settings), max_turns=5, max_response_words=100)
    return [demos_lib.render_demo(spec, seed, 0, reasoning) for seed in (1, 2, 3)]


def _spans(mask: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    spans, start = [], None
    for i, on in enumerate([*mask, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.parametrize("env,reasoning", [("frozen_lake", "grounded"), ("sokoban", "none")])
def test_openrlhf_sft_dataset_trains_assistant_turns_only(tmp_path, monkeypatch, env, reasoning):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    demos = _demos(env, reasoning)
    path = tmp_path / "demos.jsonl"
    demos_lib.write_demos(path, demos)
    args = parse_train_sft([*recipe_flags(), "--data.dataset", str(path)], monkeypatch)  # the docs' file -> ours
    assert (args.data.input_key, args.data.apply_chat_template, args.data.multiturn) == ("messages", True, True)
    strategy = Strategy(args)
    tokenizer = build_tiny_tokenizer()  # SmolLM2's template, bytes: the rollout's ids are the template's ids
    # train_sft's own calls, but num_processors: it leaves OpenRLHF's default (8 worker processes); one gives the same rows
    data = blending_datasets(args.data.dataset, args.data.dataset_probs, strategy, args.train.seed,
                             max_count=args.data.max_samples, dataset_split=args.data.dataset_split)
    data = data.select(range(min(args.data.max_samples, len(data))))
    dataset = SFTDataset(data, tokenizer, args.data.max_len, strategy, pretrain_mode=args.model.pretrain_mode_enable,
                         input_template=args.data.input_template, multiturn=args.data.multiturn, num_processors=1)
    assert len(dataset) == len(demos)  # none filtered out as too long or empty

    cfg = load_config(env=env, overrides=["rollout.max_new_tokens=400", "rollout.max_context_tokens=8192"])
    rows = demo_rows(demos, build_tiny_tokenizer(), cfg)
    for i, demo in enumerate(demos):  # blending_datasets keeps the file's order
        input_ids, attention_mask, loss_mask = dataset[i]
        ids, loss_mask = input_ids[0], loss_mask[0]
        assert attention_mask.all()
        width = int(rows.attention_mask[i].sum())
        assert torch.equal(ids[:width], rows.input_ids[i, :width])  # the chat a rollout shows and samples
        # OpenRLHF scores log p(token t+1) at position t (loss_mask[:, :-1]): the trained tokens
        trained = torch.zeros_like(ids, dtype=torch.bool)
        trained[1:] = loss_mask[:-1].bool()
        texts = [tokenizer.decode(ids[a:b]) for a, b in _spans(trained.tolist())]
        assistant = demos_lib.assistant_texts(demo)
        # Each assistant message and its end of turn, nothing else (the final "\n" is stripped by OpenRLHF).
        assert texts == [text + "<|im_end|>\n" for text in assistant[:-1]] + [assistant[-1] + "<|im_end|>"]
        # Everything the rollout trains, OpenRLHF trains; beyond it only the prefilled tag and the end of turn.
        ours = rows.response_mask[i, :width].bool()
        assert not (ours & ~trained[:width]).any()
        tag = demos_lib.prefill_of(demo)
        extra = "".join(tokenizer.decode(ids[a:b]) for a, b in _spans((trained[:width] & ~ours).tolist()))
        assert extra == (tag + "<|im_end|>\n") * (len(assistant) - 1) + tag
    batch_ids, batch_attention, batch_loss = dataset.collate_fn([dataset[i] for i in range(len(demos))])
    assert batch_ids.shape == batch_attention.shape == batch_loss.shape and batch_ids.shape[0] == len(demos)
