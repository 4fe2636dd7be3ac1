"""Count the casts of a model's weights to bf16 that a piece of code makes (a torch dispatch mode)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountWeightCasts(TorchDispatchMode):
    """`with CountWeightCasts(model) as counted: ...`; then `counted.casts` is the number of bf16
    casts of tensors that share storage with one of the model's parameters at entry."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.weights = {p.data_ptr() for p in model.parameters()}
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.weights
                and kwargs.get("dtype") == torch.bfloat16):
            self.casts += 1
        return func(*args, **kwargs)
