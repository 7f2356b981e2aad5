"""Load the compiled ops (`surgeon_kernels._C`) if they were built; set `HAS_CPP_OPS`.

Setting the environment variable `SURGEON_DISABLE_CPP=1` skips loading them (tests use this to
exercise the PyTorch fallback of an installed build).
"""

import logging
import os

import torch  # loads libc10 and friends, which the compiled library links against

logger = logging.getLogger(__name__)

HAS_CPP_OPS = False
if os.environ.get("SURGEON_DISABLE_CPP", "0") != "1":
    try:
        from surgeon_kernels import _C  # type: ignore[attr-defined]  # noqa: F401  (registers torch.ops.surgeon.*)

        HAS_CPP_OPS = True
    except ImportError as error:
        logger.debug("compiled ops unavailable: %s", error)

if HAS_CPP_OPS:

    @torch.library.register_fake("surgeon::kfac_accumulate")
    def _kfac_accumulate_fake(outs: list[torch.Tensor], xs: list[torch.Tensor], scale: float, bias: list[bool]) -> None:
        """Shape-only version for tracing: the op mutates `outs` and returns nothing."""
        return None

    @torch.library.register_fake("surgeon::nm_select")
    def _nm_select_fake(costs: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape-only version for tracing: group costs [R, C/m] and a boolean mask [R, C]."""
        rows, cols = costs.shape
        return costs.new_empty(rows, cols // m), costs.new_empty(rows, cols, dtype=torch.bool)

    @torch.library.register_fake("surgeon::kk_solve")
    def _kk_solve_fake(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                       w: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape-only version for tracing: u like w and one failure flag per chunk."""
        return torch.empty_like(w), w.new_empty(offsets.shape[0] - 1, dtype=torch.bool)
