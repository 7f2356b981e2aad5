"""`surgeon prune` with every factor input rounded to bfloat16 (products and sums stay float32).

    python bench/bf16_factor_inputs.py prune --model smollm2-135m --structure structured --target-size 0.8 \
        --shots 4 --nsamples 8 --seqlen 512 --eval-seqlen 2048 --calibration wikitext2-valid --eval-windows 8 \
        --output DIR

Measures what a bfloat16-input, float32-accumulating factor kernel (AVX512-BF16 `vdpbf16ps` on the
CPU) would cost in quality before writing one: the model's forward and backward stay float32, only
the activations and output gradients entering A and G are rounded (`ops.kfac_accumulate_group` is
wrapped; the compiled op converts them back to float32). Timings of such a run mean nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from surgeon_kernels import ops  # noqa: E402

_accumulate = ops.kfac_accumulate_group


def _rounded(outs, xs, scale, biases, backend="auto") -> None:
    """`ops.kfac_accumulate_group` on the inputs rounded to bfloat16."""
    _accumulate(outs, [x.bfloat16() for x in xs], scale, biases, backend)


if __name__ == "__main__":
    ops.kfac_accumulate_group = _rounded
    from surgeon.app.cli import main

    sys.exit(main(sys.argv[1:]))
