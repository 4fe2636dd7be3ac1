"""The local engine: one process, torch + transformers, CPU or one GPU.

`trainer` is the loop (rollout, probe, filter, update, validation, checkpoints); `learner` holds
the models, their optimisers, the forward passes and the PPO update; `checkpoint` and
`interrupts` make a run resumable bit for bit.
"""
