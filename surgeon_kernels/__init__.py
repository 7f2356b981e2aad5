"""Kernels for the hot spots of LLM Surgeon, each beside its plain-PyTorch reference.

`surgeon_kernels.ops` is the only entry point the algorithm uses: one function per op with a
`backend` argument ("auto", "triton", "cpp", "torch").
"""

from surgeon_kernels._ext import HAS_CPP_OPS
from surgeon_kernels.deferred import Deferred
from surgeon_kernels.ops import (
    available_backends,
    batched_eigh,
    kfac_accumulate,
    kfac_accumulate_group,
    kk_gather,
    kk_solve,
    kth_smallest,
    nm_select,
)

__all__ = [
    "HAS_CPP_OPS", "Deferred", "available_backends", "batched_eigh", "kfac_accumulate", "kfac_accumulate_group",
    "kk_gather", "kk_solve", "kth_smallest", "nm_select",
]
