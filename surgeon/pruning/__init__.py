"""The shot loop (paper Algorithm 1): curvature hooks, block inputs, structured and element shots,
interleaved LoRA, reports and resumable checkpoints."""
