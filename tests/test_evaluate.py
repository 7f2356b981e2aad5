"""Perplexity protocol: consecutive windows, mean NLL per window, exp of the mean."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from surgeon.app import evaluate
from surgeon.app.data import windows_of
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


def test_with_bos_every_window_begins_with_it_on_the_same_targets_and_without_it_only_the_text_does():
    """The published protocol cuts windows from the whole text (only the first begins with BOS); with `bos` every
    window's first token becomes it, and the scored tokens stay those after it."""
    model = tiny_model("llama")
    bos = model.config.bos_token_id
    ids = torch.randint(3, 96, (1, 96), generator=torch.Generator().manual_seed(1))
    ids[0, 0] = bos

    def manual(begin: bool) -> float:
        nlls = []
        with torch.no_grad():
            for i in range(3):
                window = ids[:, i * 32:(i + 1) * 32].clone()
                if begin:
                    window[0, 0] = bos
                nlls.append(F.cross_entropy(model(window).logits[0, :-1], window[0, 1:]).item())
        return math.exp(sum(nlls) / 3)

    begun, cut = manual(True), manual(False)
    assert begun != pytest.approx(cut, rel=1e-4)  # the later windows did change
    assert perplexity(model, ids, seqlen=32, progress=False, bos=bos).ppl == pytest.approx(begun, rel=FLOAT32["rtol"])
    assert perplexity(model, ids, seqlen=32, progress=False).ppl == pytest.approx(cut, rel=FLOAT32["rtol"])
    assert windows_of(ids, 32, 2, bos)[:, 0].tolist() == [bos, bos]
    assert torch.equal(windows_of(ids, 32, 2), ids[0, :64].reshape(2, 32))


def test_perplexity_errors():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 100))
    with pytest.raises(SurgeonError, match="longer than the model allows"):
        perplexity(model, ids, seqlen=65, progress=False)
    with pytest.raises(SurgeonError, match="fewer than one window"):
        perplexity(model, ids[:, :20], seqlen=32, progress=False)
