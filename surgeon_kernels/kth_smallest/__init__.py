"""Global threshold: the k-th smallest of many cost tensors, without concatenating or sorting them."""
