"""The instruments wired into a training step: the MI probe (`probe`) and the sampled
completions a run records (`completions`); the gradient decomposition, which takes the local
engine's update inputs, lives with it (`engines/local/grad_decomp`).
The maths lives in `mi_probe/` and `snr/`; these modules feed them the engine's tensors."""
