"""Model adapters: everything that knows a model's module names and architecture.

Loading (hub, local, GGUF), the decoder blocks and their prunable layers, a prunable weight as a
`Layer`, the channels and coupled units that span several layers, fused Mixture-of-Experts experts
as layers, and the modeling code of the per-layer (DeciLM) export.
"""
