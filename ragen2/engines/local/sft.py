"""Supervised warm start on expert demonstrations (`ragen2 sft`), on the local engine's machinery.

    summary = run_sft(cfg, demos, run_dir)      # cfg: ragen2.config.Config (its `sft` section)

1. Rows. Each demo is replayed through the rollout's own `Episode` (its env, the chat template, the
   prefilled tag) with the demo's assistant texts standing in for sampled replies, so a demo becomes
   exactly the row an RL update of that trajectory trains: the same token ids, the same response
   mask (each turn's tokens after the prefilled tag; template, user and env text are not trained).
2. Steps. Each optimiser step takes sft.batch_episodes rows (epoch by epoch, a permutation drawn
   from trainer.seed and the epoch, so a resumed run takes the same rows), cut into micro-batches
   (optim.micro_batch_size; rows sharing a prefix encode it once when optim.shared_prefix, and a
   micro-batch runs as one unpadded sequence when sft.padding_free), and
   minimises the token-mean negative log-likelihood of the masked tokens (`losses.sft_loss`).
3. Validation is `ragen2 train`'s: the same instances (seeding.validation_seeds), temperature and
   rollout settings, at trainer.val_every, at the end, and before the first step (trainer.val_before).
4. Checkpoints are `ragen2 train`'s (Ctrl-C saves the last finished step; --resume continues). At the
   end the policy is written as a Hugging Face folder, RUN/model, so `--model RUN` works wherever a
   model is taken (train, eval, audit).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ragen2 import demos as demos_lib
from ragen2 import metric_names as names
from ragen2.algos import losses
from ragen2.config import Config
from ragen2.engines.local import checkpoint as ckpt
from ragen2.engines.local import learner, minibatch
from ragen2 import precision
from ragen2 import shared_prefix as prefix_lib
from ragen2.engines.local.interrupts import Interrupts
from ragen2.engines.local.run import env_factory
from ragen2.engines.local.trainer import apply_threads
from ragen2.progress import LiveLine, format_eta
from ragen2.rollout import evaluate
from ragen2.rollout.batch import RolloutBatch
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.episode import Episode, TurnRules
from ragen2.run_dir import RunLog, read_steps, write_config, write_summary
from ragen2.seeding import validation_sampling_seed, validation_seeds

MODEL_DIR = "model"  # RUN/model: the warm-started policy as a Hugging Face folder
SFT_LOSS, SFT_TOKENS, SFT_EPOCH = "sft/loss", "sft/tokens", "sft/epoch"


def demo_rows(demos: list[dict], tokenizer, cfg: Config) -> RolloutBatch:
    """The demos as RL training rows (see the module doc, 1); DemosError if a demo does not replay."""
    chat = ChatFormat(tokenizer)
    rules = TurnRules(max_turns=10**6, max_new_tokens=cfg.rollout.max_new_tokens,
                      max_context_tokens=cfg.rollout.max_context_tokens, prefill=cfg.rollout.prefill_tag,
                      max_response_words=None)
    rows, records, too_long = [], [], 0
    for index, demo in enumerate(demos):
        spec = demos_lib.spec_of(demo)
        own_rules = dataclasses.replace(rules, max_turns=spec.max_turns, max_response_words=spec.max_response_words)
        episode = Episode(spec.make_env(), chat, own_rules,
                          seed=int(demo["seed"]), rollout_index=int(demo.get("rollout_index", 0)), group=index,
                          index=index)
        episode.reset()
        for text in demos_lib.assistant_texts(demo):
            if episode.next_prompt() is None:
                break
            reply = text[len(episode.prefill):] if text.startswith(episode.prefill) else None
            if reply is None:
                raise demos_lib.DemosError(f"demo {index + 1}: an assistant turn does not open with the prefilled "
                                           f"tag {episode.prefill!r} (rollout.prefill_tag is on)")
            ids = chat.encode(reply)
            too_long += len(ids) > cfg.rollout.max_new_tokens
            episode.take_reply(ids, [0.0] * len(ids), "stop")
        if episode.record.success != bool(demo["success"]):
            raise demos_lib.DemosError(f"demo {index + 1}: replayed through the chat template it ends with success "
                                       f"{episode.record.success}, recorded {demo['success']}")
        rows.extend(episode.rows())
        records.append(episode.record)
    if too_long:
        print(f"note: {too_long} demo turns are longer than rollout.max_new_tokens={cfg.rollout.max_new_tokens}: "
              "a rollout could not sample them whole", file=sys.stderr)
    return RolloutBatch.from_records(rows, records, pad_token_id=tokenizer.pad_token_id or 0, group_size=1)


def epoch_order(seed: int, epoch: int, rows: int) -> list[int]:
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def step_rows(cfg: Config, step: int, rows: int) -> tuple[list[int], int]:
    """The rows of optimiser step `step` (0-based) and its epoch: a pure function of the seed and step."""
    per = min(cfg.sft.batch_episodes, rows)
    start = step * per
    epoch, offset = divmod(start, rows)
    picked = []
    while len(picked) < per:
        order = epoch_order(cfg.trainer.seed, epoch, rows)
        take = order[offset:offset + per - len(picked)]
        picked += take
        epoch, offset = epoch + 1, 0
    return picked, start // rows


def learning_rate(cfg: Config, step: int) -> float:
    warm = cfg.sft.warmup_steps
    return cfg.sft.lr * min(1.0, (step + 1) / (warm + 1))


def padding_free_note(cfg: Config, policy) -> str | None:
    """One line when sft.padding_free is asked for but cannot run, so the setting is not dropped unsaid."""
    if not cfg.sft.padding_free:
        return None
    refusal = learner.padding_free_refusal("sft.padding_free", True, policy, "SFT's steps")
    if refusal:
        return refusal
    if cfg.model.gradient_checkpointing:
        return ("note: under gradient checkpointing the step's common prefix is not encoded apart (its layers "
                "drop the cache); micro-batches still run unpadded")
    return None


def step_prefix(policy, batch: RolloutBatch, rows: torch.Tensor) -> prefix_lib.EncodedPrefix | None:
    """The tokens every row of the step starts with (the system prompt), encoded once for the step;
    None under gradient checkpointing, whose layers drop the cache that carries it."""
    length = prefix_lib.step_prefix_length(batch, rows)
    if not length or not prefix_lib.supported(policy.get_decoder()):
        return None
    with precision.autocast(policy):
        return prefix_lib.encode_prefix(policy.get_decoder(), batch.input_ids[rows[0], :length])


def sft_step(models: learner.Models, optimizer: torch.optim.Optimizer, batch: RolloutBatch, rows: list[int],
             cfg: Config, step: int) -> dict[str, float]:
    """One optimiser step on `rows`: token-mean NLL of their assistant tokens, clipped, stepped.

    The loss is the actor's (learner.actor_loss, ActorLossSettings.supervised) at advantage 1 and
    ratio 1, whose gradient is the NLL's; the NLL itself is what `sft/loss` logs."""
    policy = models.policy
    policy.train()
    index = torch.tensor(rows)
    mask = batch.response_mask
    total = max(1, int(mask[index].sum()))
    packs = cfg.sft.padding_free and prefix_lib.padding_free_supported(policy.get_decoder())
    prefix = step_prefix(policy, batch, index) if packs else None
    if cfg.optim.shared_prefix or packs:
        micro = prefix_lib.micro_batches(batch, index, cfg.optim.micro_batch_size, attention=prefix_lib.attention_cost(policy),
                                         padding_free=prefix_lib.PaddingFree.after(prefix) if packs else None)
    else:
        micro = index.split(cfg.optim.micro_batch_size)
    loss_sum, settings = 0.0, learner.ActorLossSettings.supervised(cfg)
    for part in micro:
        built = learner.actor_loss(policy, learner.ActorBatch.demonstrations(batch, part, prefix), settings,
                                   {"total_tokens": total})
        built.terms["task"].backward()
        loss_sum += losses.sft_loss(built.log_probs.detach(), mask[part], total_tokens=total).item()
    if prefix is not None:
        prefix.backward()  # the micro-batches' gradients through the step's prefix, in one pass
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(cfg, step)
    norm = minibatch.clip_grad(policy, cfg.optim.grad_clip)
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {SFT_LOSS: loss_sum, SFT_TOKENS: float(total), names.ACTOR_GRAD_NORM: norm,
            "sft/lr": learning_rate(cfg, step), "sft/skipped_nonfinite": float(not math.isfinite(norm))}


@dataclass
class SFTRun:
    cfg: Config
    run_dir: Path
    models: learner.Models
    optimizers: learner.Optimizers
    batch: RolloutBatch
    log: RunLog
    live: LiveLine
    step: int = 0


def validate(run: SFTRun) -> dict:
    """`ragen2 train`'s validation: the same instances, settings and rollout."""
    cfg, started = run.cfg, time.perf_counter()
    generator = torch.Generator().manual_seed(validation_sampling_seed(cfg))
    rollout_cfg = dataclasses.replace(cfg.rollout, temperature=cfg.trainer.val_temperature)
    metrics = evaluate(run.models.policy, run.models.tokenizer, env_factory(cfg, cfg.env.val_name),
                       validation_seeds(cfg), rollout_cfg, generator, progress=run.live.rollout("validation"))
    run.live.stop()
    metrics[names.TIME_VALIDATION_S] = round(time.perf_counter() - started, 4)
    return metrics


def build_policy(cfg: Config) -> learner.Models:
    """The policy alone (SFT has no critic and no reference), in the compute dtype model.dtype resolves to."""
    from ragen2 import models as model_lib
    from ragen2 import precision

    device = model_lib.pick_device(cfg.model.device)
    cfg.model.dtype = precision.resolve(cfg.model.dtype, device).dtype
    policy, tokenizer = model_lib.build_policy(cfg.model, device)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    return learner.Models(policy, tokenizer, None, None, device)


def setup(cfg: Config, demos: list[dict], run_dir: Path, resume: bool = False, quiet: bool = False) -> SFTRun:
    """Models, optimiser and rows; the newest checkpoint on resume. Nothing is written before all loaded."""
    apply_threads(cfg, lambda line: print(line, file=sys.stderr))
    torch.manual_seed(cfg.trainer.seed)
    models = build_policy(cfg)
    note = padding_free_note(cfg, models.policy)
    if note:
        print(note, file=sys.stderr)
    optimizers = learner.build_optimizers(models, cfg)
    batch = demo_rows(demos, models.tokenizer, cfg)
    step = 0
    if resume and ckpt.complete_checkpoints(run_dir):
        generator = torch.Generator()
        _, state = ckpt.load_latest(run_dir, models, optimizers, generator, lambda line: print(line, file=sys.stderr))
        step = state["step"]
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    log = RunLog(run_dir, cfg.sft.steps, json.loads(cfg.model_dump_json()), resume_step=step, quiet=True)
    return SFTRun(cfg, run_dir, models, optimizers, batch, log, LiveLine(enabled=LiveLine.wanted(quiet)), step)


def save(run: SFTRun) -> None:
    path = ckpt.save_checkpoint(run.run_dir, run.step, ckpt.Saved(run.models, run.optimizers, torch.Generator()),
                                {"sft": True}, ckpt.SaveOptions.of(run.cfg.trainer))
    run.log.event("checkpoint", path=str(path), step=run.step)


def write_model_folder(run: SFTRun) -> Path:
    """RUN/model: the policy as a plain Hugging Face folder (LoRA merged), for `--model RUN`."""
    from ragen2.export import _plain, _readable

    policy = run.models.policy
    if hasattr(policy, "merge_and_unload"):  # the run is over: merging in place changes nothing it needs
        policy = policy.merge_and_unload()
    out = run.run_dir / MODEL_DIR
    _plain(policy).save_pretrained(out)
    run.models.tokenizer.save_pretrained(out)
    _readable(out)
    return out


def weights_digest(weights: Path) -> str:
    """sha256 of the written weights' tensors (names, dtypes, shapes, bytes, in name order; not the files,
    whose metadata order is not part of the weights): a rebuilt warm start is the same model iff this
    matches (the same commands and code on the same kind of CPU, thread count and dtype)."""
    import hashlib

    from safetensors import safe_open

    digest = hashlib.sha256()
    weights = Path(weights)  # a model folder, or one safetensors file (a checkpoint's policy)
    for path in sorted(weights.glob("*.safetensors")) if weights.is_dir() else [weights]:
        with safe_open(str(path), framework="pt") as handle:
            for name in sorted(handle.keys()):
                tensor = handle.get_tensor(name).contiguous()
                digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
                digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train(run: SFTRun, quiet: bool = False) -> dict:
    """Run the remaining steps; the summary (summary.json), or `interrupted` after Ctrl-C (resumable)."""
    cfg, started = run.cfg, time.time()
    say = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    interrupts = Interrupts(quiet=quiet)
    interrupts.install()
    try:
        if cfg.trainer.val_before and run.step == 0:
            before = validate(run)
            run.log.event("validation_before", step=0, metrics=before,
                          message=f"validation before SFT: success {before[names.VAL_SUCCESS_RATE]:.3f}")
            say(f"validation before SFT: success {before[names.VAL_SUCCESS_RATE]:.3f} "
                f"({before[names.TIME_VALIDATION_S]:.0f}s)")
        first = run.step
        while run.step < cfg.sft.steps and not interrupts.requested:
            step_started = time.perf_counter()
            rows, epoch = step_rows(cfg, run.step, run.batch.input_ids.shape[0])
            metrics = sft_step(run.models, run.optimizers.actor, run.batch, rows, cfg, run.step)
            seconds = time.perf_counter() - step_started
            metrics.update({SFT_EPOCH: float(epoch), names.TIME_STEP_S: round(seconds, 4),
                            "sft/tokens_per_s": metrics[SFT_TOKENS] / max(seconds, 1e-9)})
            last = run.step + 1 == cfg.sft.steps
            if last or (cfg.trainer.val_every and (run.step + 1) % cfg.trainer.val_every == 0):
                metrics.update(validate(run))
            run.log.step(run.step, metrics)
            run.step += 1
            done = run.step - first
            eta = (time.time() - started) / done * (cfg.sft.steps - run.step)
            val = f" | val success {metrics[names.VAL_SUCCESS_RATE]:.3f}" if names.VAL_SUCCESS_RATE in metrics else ""
            say(f"sft step {run.step}/{cfg.sft.steps} | loss {metrics[SFT_LOSS]:.4f} | epoch {epoch + 1} | "
                f"{seconds:.1f}s{val} | elapsed {(time.time() - started) / 60:.1f} min | ETA {format_eta(eta)}")
            if (cfg.trainer.save_every and run.step % cfg.trainer.save_every == 0) or last:
                save(run)
    finally:
        interrupts.restore()
    if interrupts.requested:
        if run.step > 0:
            save(run)
        message = f"{interrupts.signal_name}: stopped after step {run.step}; continue with: ragen2 sft --resume {run.run_dir}"
        run.log.event("stop", reason="interrupted", message=message, step=run.step)
        run.log.close()
        return {"interrupted": interrupts.signal_name, "steps": run.step, "message": message}
    model_dir = write_model_folder(run)
    steps = read_steps(run.run_dir)
    final = steps[-1] if steps else {}
    summary = {"engine": "local", "kind": "sft", "steps": run.step, "demos": cfg.sft.demos,
               "demo_rows": int(run.batch.input_ids.shape[0]),
               "trained_tokens": int(sum(s.get(SFT_TOKENS, 0) for s in steps)),
               "first_loss": steps[0].get(SFT_LOSS) if steps else None, "last_loss": final.get(SFT_LOSS),
               "val_success_rate": final.get(names.VAL_SUCCESS_RATE), "wall_s": round(time.time() - started, 1),
               "model_dir": str(model_dir), "model_sha256": weights_digest(model_dir),
               "num_threads": cfg.trainer.num_threads, "dtype": cfg.model.dtype}
    write_summary(run.run_dir, summary)
    run.log.close()
    return summary
