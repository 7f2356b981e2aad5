"""Exports of a pruned model without its removed units: standard and per-layer (DeciLM) checkpoints."""
