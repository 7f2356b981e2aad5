"""Perplexity protocol: consecutive windows, mean NLL per window, exp of the mean."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from surgeon.app import evaluate
from surgeon.app.evaluate import perplexity
from surgeon.errors import SurgeonError
from tests._helpers import tiny_model
from tests._tolerances import FLOAT32


@pytest.mark.parametrize("chunk", [512, 5])  # the NLL of a whole window in one piece, and in pieces with a ragged last
def test_perplexity_matches_manual_computation(chunk, monkeypatch):
    monkeypatch.setattr(evaluate, "NLL_CHUNK", chunk)
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 100), generator=torch.Generator().manual_seed(0))
    result = perplexity(model, ids, seqlen=32, progress=False)
    assert result.windows == 3 and result.tokens == 96
    with torch.no_grad():
        nlls = [F.cross_entropy(model(ids[:, i * 32:(i + 1) * 32]).logits[0, :-1], ids[0, i * 32 + 1:(i + 1) * 32])
                for i in range(3)]
    assert result.ppl == pytest.approx(math.exp(sum(n.item() for n in nlls) / 3), rel=FLOAT32["rtol"])
    first = perplexity(model, ids, seqlen=32, windows=1, progress=False)
    assert first.windows == 1 and first.ppl == pytest.approx(math.exp(nlls[0].item()), rel=FLOAT32["rtol"])
    assert perplexity(model, ids, seqlen=32, progress=False).ppl == result.ppl  # deterministic


def test_perplexity_errors():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 100))
    with pytest.raises(SurgeonError, match="longer than the model allows"):
        perplexity(model, ids, seqlen=65, progress=False)
    with pytest.raises(SurgeonError, match="fewer than one window"):
        perplexity(model, ids[:, :20], seqlen=32, progress=False)
