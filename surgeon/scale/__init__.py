"""Scale-out: the ranks that share one run under torchrun, block groups, and the memory planner."""
