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


def test_windows_begin_with_bos_where_the_text_does():
    """A text the tokenizer began with BOS is scored with BOS before every window, on the same targets; a text
    without it is scored as cut."""
    model = tiny_model("llama")
    ids = torch.randint(3, 96, (1, 96), generator=torch.Generator().manual_seed(1))
    begun = ids.clone()
    begun[0, 0] = model.config.bos_token_id

    def manual(text: torch.Tensor, bos: int | None) -> float:
        nlls = []
        with torch.no_grad():
            for i in range(3):
                window = text[:, i * 32:(i + 1) * 32].clone()
                if bos is not None:
                    window[0, 0] = bos
                nlls.append(F.cross_entropy(model(window).logits[0, :-1], window[0, 1:]).item())
        return math.exp(sum(nlls) / 3)

    scored = perplexity(model, begun, seqlen=32, progress=False).ppl
    assert scored == pytest.approx(manual(begun, model.config.bos_token_id), rel=FLOAT32["rtol"])
    assert scored != pytest.approx(manual(begun, None), rel=1e-4)  # the later windows did change
    assert perplexity(model, ids, seqlen=32, progress=False).ppl == pytest.approx(manual(ids, None),
                                                                                 rel=FLOAT32["rtol"])


def test_perplexity_errors():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 100))
    with pytest.raises(SurgeonError, match="longer than the model allows"):
        perplexity(model, ids, seqlen=65, progress=False)
    with pytest.raises(SurgeonError, match="fewer than one window"):
        perplexity(model, ids[:, :20], seqlen=32, progress=False)
