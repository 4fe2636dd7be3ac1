"""The instruments wired into a training step: the MI probe (`probe`), the gradient
decomposition (`grad_decomp`) and the sampled completions a run records (`completions`).
The maths lives in `mi_probe/` and `snr/`; these modules feed them the engine's tensors."""
