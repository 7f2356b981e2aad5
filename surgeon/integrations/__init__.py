"""Adapters that let other pruning pipelines call surgeon's solver (README, "Use the solver from your own code")."""
