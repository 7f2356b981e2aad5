"""Recovery after pruning: the pruned model trained to match the dense model's next-token distributions, every
weight pruning removed kept exactly zero."""

LOSSES = ("kl", "next-token")  # to the dense model's next-token distributions, or to the text's next tokens
