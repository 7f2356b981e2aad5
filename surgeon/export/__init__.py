"""Exports of a pruned model without its removed units: standard and per-layer (DeciLM) checkpoints."""

EXPORT_FORMATS = ("standard", "decilm")  # the model's own architecture, or DeciLM's widths per layer
