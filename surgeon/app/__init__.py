"""What a user runs: the command line, runs with their output folders, data, evaluation, zero-shot tasks and
report figures."""
