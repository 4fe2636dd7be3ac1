"""Bridges from other trainers to ragen2's pieces (`snr`, `mi_probe`, `envs`).

Each integration is a subpackage imported only when used (``ragen2.integrations.trl``), so
ragen2 itself never imports another trainer.
"""
