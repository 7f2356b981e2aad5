"""Exports of a pruned model without its removed units: standard, heterogeneous and DeciLM checkpoints."""
