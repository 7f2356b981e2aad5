"""The method's mathematics: tensors in, tensors out (docs/DESIGN.md, "The method").

Damping, the Kronecker-factored inverse F⁻¹ = G⁻¹ ⊗ A⁻¹, the costs of eq. 7, the global threshold,
the correlated updates of eqs. 4-5 and sec. 3.4, the matrix-level solver behind `surgeon.solve`, and
the baselines' own rules. Nothing here knows `nn.Module`, Hugging Face or `torch.distributed`.
"""
