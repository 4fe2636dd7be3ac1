"""Test harness only: OpenRLHF 0.11.2's pipeline on a CPU-only machine (see test_openrlhf_e2e.py).

Installed at start-up in every process (sitecustomize.py). Nothing in site-packages is edited:
stand-in modules go into sys.modules, and the few CUDA-only calls are replaced right after the
module that makes them is imported (an import hook), each naming the OpenRLHF line it serves.

- Stand-ins: `flash_attn` (imported by openrlhf/models/ring_attn_utils.py, used only with
  --ds.packing_samples; openrlhf/models/utils.py falls back to torch when flash_attn.ops is
  missing) and `vllm` (import-time names of trainer/ray/vllm_engine.py and samples_generator.py;
  SamplingParams a plain class, pickled by reference as vllm.SamplingParams).
- torch (C1-C3): torch.cuda.set_device (utils/deepspeed/deepspeed.py:97, setup_distributed),
  current_device -> "cpu" (a .to() target in trainer/ray/ppo_actor.py, ppo_critic.py,
  launcher.py, deepspeed.py), synchronize (utils/distributed_util.py:10 and others) become CPU-safe.
  torch.cuda.is_available() stays False, so DeepSpeed (DS_ACCELERATOR=cpu, gloo) sees a CPU machine.
- C4 trainer/ppo_utils/replay_buffer.py:40: `torch.device(f"cuda:{current_device()}")` -> cpu.
- C5 trainer/ray/utils.py get_physical_gpu_id (torch.cuda device properties: the GPU's UUID) keys each
  rank's weight-sync handle (ppo_actor.py:445) and picks the engine's own (vllm_worker_wrap.py:61, here
  orl_hf_engine): the Ray GPU id the process was given instead, which names the same device for a
  rank and the engine colocated with it, as the UUID does on a GPU node.
- E1 trainer/ray/vllm_engine.py: `RolloutRayActor` (read by create_vllm_engines when called) is
  orl_hf_engine.HFRolloutActor: OpenRLHF's own actor class with generate on HF transformers.
- R1 ray.init: a local instance on 127.0.0.1 with logical GPUs (each OpenRLHF placement bundle
  asks for {"GPU": 1}), few CPUs, no dashboard, a short temp dir, this folder on PYTHONPATH.
- T1 the controller's `select_samples`: each step's seeds, reward matrix and kept groups are
  appended to $RAGEN2_HARNESS_DIR/steps.jsonl for the test to read (observation only).
- T2 the agent's `_next_member`: each sample's seed and rollout index, in call order, are appended
  to $RAGEN2_HARNESS_DIR/members.jsonl (observation only).
- T3 the agent's `_play`: each finished episode's seed, rollout index, trained context
  (observation_tokens) and sampled spans (action_ranges) are appended to
  $RAGEN2_HARNESS_DIR/episodes.jsonl (observation only).

The launched command is the project's own: `--ds.attn_implementation` comes from the config
(openrlhf.attn_implementation=auto resolves to sdpa where flash-attn is not installed; the
stand-in module above has no distribution, so it does not count).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
APPLIED: list[str] = []


# ----------------------------------------------------------------------------- stand-in modules


class SamplingParams:
    """vllm.SamplingParams stand-in: a plain record of the fields, with vLLM 0.29.0's defaults; what vLLM
    derives from them (greedy, stop ids, max_tokens) is vllm_semantics.resolve's, in the engine."""

    def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=None, stop_token_ids=None,
                 ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, skip_special_tokens=True,
                 include_stop_str_in_output=False, **extra):
        self.__dict__.update(n=n, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                             stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, max_tokens=max_tokens,
                             min_tokens=min_tokens, logprobs=logprobs, skip_special_tokens=skip_special_tokens,
                             include_stop_str_in_output=include_stop_str_in_output, **extra)


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__path__ = []
    return module


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"CPU harness: {what} is a stand-in")
    return refuse


def install_stand_ins() -> None:
    fa, bert, fa_utils, fa_dist = (_module(n) for n in ("flash_attn", "flash_attn.bert_padding", "flash_attn.utils",
                                                         "flash_attn.utils.distributed"))
    for name in ("index_first_axis", "pad_input", "rearrange", "unpad_input"):
        setattr(bert, name, _refuse(f"flash_attn.bert_padding.{name} (--ds.packing_samples)"))
    fa_dist.all_gather = _refuse("flash_attn all_gather")
    fa.bert_padding, fa.utils, fa_utils.distributed = bert, fa_utils, fa_dist
    vllm, inputs, utils = (_module(n) for n in ("vllm", "vllm.inputs", "vllm.utils"))
    vllm.__version__ = "0.29.0"  # what openrlhf[vllm]==0.11.2 pins
    SamplingParams.__module__ = "vllm"
    vllm.SamplingParams = SamplingParams
    vllm.AsyncEngineArgs = _refuse("vllm.AsyncEngineArgs (the engine actor is orl_hf_engine)")
    vllm.AsyncLLMEngine = types.SimpleNamespace(from_engine_args=vllm.AsyncEngineArgs)
    inputs.TokensPrompt = dict
    utils.random_uuid = lambda: uuid.uuid4().hex
    vllm.inputs, vllm.utils = inputs, utils
    for module in (fa, bert, fa_utils, fa_dist, vllm, inputs, utils):
        sys.modules.setdefault(module.__name__, module)


# ----------------------------------------------------------------------------- patch-after-import hook


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks[name](module) right after module `name` is executed, wherever it is imported."""

    def __init__(self, callbacks: dict):
        self.callbacks, self.busy = callbacks, set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        inner, callback = spec.loader, self.callbacks[name]

        class Loader(importlib.abc.Loader):
            def __getattr__(self, name):  # get_code, is_package, ...: the real loader's
                return getattr(inner, name)

            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                callback(module)

        spec.loader = Loader()
        return spec


def _torch(torch) -> None:
    torch.cuda.set_device = lambda device: None  # C1
    torch.cuda.current_device = lambda: "cpu"  # C2
    torch.cuda.synchronize = lambda device=None: None  # C3
    APPLIED.extend(["C1", "C2", "C3"])


def _replay_buffer(module) -> None:  # C4
    import torch

    original = module.NaiveReplayBuffer.__init__

    def init(self, *args, **kwargs):
        saved, torch.cuda.current_device = torch.cuda.current_device, (lambda: 0)
        try:
            original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = saved
        self.target_device = torch.device("cpu")

    module.NaiveReplayBuffer.__init__ = init
    APPLIED.append("C4")


def _ray_utils(module) -> None:  # C5
    def get_physical_gpu_id() -> str:
        import ray

        gpus = ray.get_gpu_ids()
        if not gpus:
            raise RuntimeError("CPU harness: get_physical_gpu_id outside a Ray worker that holds a GPU")
        return f"ray-gpu-{gpus[0]}"

    module.get_physical_gpu_id = get_physical_gpu_id  # before ppo_actor imports it by name
    APPLIED.append("C5")


def _vllm_engine(module) -> None:  # E1
    if "orl_hf_engine" in sys.modules:  # a Ray worker unpickling the engine class: it needs no patch
        return
    import orl_hf_engine

    module.RolloutRayActor = orl_hf_engine.HFRolloutActor
    APPLIED.append("E1")


def _ray(ray) -> None:  # R1
    original = ray.init

    def init(*args, **kwargs):
        runtime_env = dict(kwargs.pop("runtime_env", None) or {})
        env_vars = dict(runtime_env.get("env_vars") or {})
        for key in ("PYTHONPATH", "RAGEN2_OPENRLHF_CPU_HARNESS", "RAGEN2_HARNESS_DIR", "DS_ACCELERATOR",
                    "TORCHDYNAMO_DISABLE", "TORCH_EXTENSIONS_DIR", "OMP_NUM_THREADS", "HF_HUB_OFFLINE",
                    "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM"):
            if key in os.environ:
                env_vars[key] = os.environ[key]
        runtime_env["env_vars"] = env_vars
        kwargs.update(num_gpus=int(os.environ.get("RAGEN2_HARNESS_GPUS", "1")),
                      num_cpus=int(os.environ.get("RAGEN2_HARNESS_CPUS", "4")), include_dashboard=False,
                      _node_ip_address="127.0.0.1", _temp_dir=os.environ["RAGEN2_HARNESS_RAY_TMP"])
        for attempt in range(3):  # Ray gives its raylet 30 s to register (node.py): a loaded machine can miss it
            try:
                return original(*args, runtime_env=runtime_env, **kwargs)
            except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for this
                if "timed out during startup" not in str(error) or attempt == 2:
                    raise
                print(f"CPU harness: ray.init attempt {attempt + 1} timed out; retrying", file=sys.stderr)
                ray.shutdown()

    ray.init = init
    APPLIED.append("R1")


def _trainer_patch(module) -> None:  # T1
    original = module.select_samples

    def select_samples(samples, group_size, filter_config, unit):
        chosen = original(samples, group_size, filter_config, unit)
        from ragen2.engines.openrlhf.selection import group_reward_matrix

        seeds = [json.loads(samples[g].labels[0])["seed"] for g in range(0, len(samples), group_size)]
        row = {"seeds": seeds, "rewards": group_reward_matrix(samples, group_size).tolist(),
               "kept": chosen.kept_groups, "skip": chosen.skip}
        with open(os.path.join(os.environ["RAGEN2_HARNESS_DIR"], "steps.jsonl"), "a") as handle:
            handle.write(json.dumps(row) + "\n")
        return chosen

    module.select_samples = select_samples
    APPLIED.append("T1")


def _agent(module) -> None:  # T2, T3
    original = module.AgentExecutor._next_member

    def next_member(self, label, group_size=None):
        member = original(self, label, group_size)
        row = {"seed": json.loads(label)["seed"], "member": member, "pid": os.getpid()}
        with open(os.path.join(os.environ["RAGEN2_HARNESS_DIR"], "members.jsonl"), "a") as handle:
            handle.write(json.dumps(row) + "\n")
        return member

    module.AgentExecutor._next_member = next_member
    original_play = module.AgentExecutor._play

    async def play(self, spec, member, *args, **kwargs):  # T3
        result = await original_play(self, spec, member, *args, **kwargs)
        row = {"seed": spec.seed, "member": member, "observation_tokens": [int(t) for t in result["observation_tokens"]],
               "action_ranges": [list(span) for span in result["action_ranges"]]}
        with open(os.path.join(os.environ["RAGEN2_HARNESS_DIR"], "episodes.jsonl"), "a") as handle:
            handle.write(json.dumps(row) + "\n")
        return result

    module.AgentExecutor._play = play
    APPLIED.extend(["T2", "T3"])


CALLBACKS = {"torch": _torch, "ray": _ray, "openrlhf.trainer.ppo_utils.replay_buffer": _replay_buffer,
             "openrlhf.trainer.ray.utils": _ray_utils, "openrlhf.trainer.ray.vllm_engine": _vllm_engine,
             "ragen2.engines.openrlhf.trainer_patch": _trainer_patch, "ragen2.engines.openrlhf.agent": _agent}


def install() -> None:
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    install_stand_ins()
    sys.meta_path.insert(0, _AfterImport(CALLBACKS))
    for name, callback in CALLBACKS.items():  # already imported (unlikely at start-up): patch now
        if name in sys.modules:
            callback(sys.modules[name])
