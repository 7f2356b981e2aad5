"""The real SmolLM2-135M (embedded GGUF): load, perplexity, and a short structured prune."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.app.data import calibration_text, calibration_windows, evaluation_text, tokenize
from surgeon.app.evaluate import perplexity
from surgeon.models.adapter import load_model, prunable_layers
from tests._tolerances import assert_reaches_target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer = load_model("smollm2-135m")
    return model, tokenizer, tokenize(tokenizer, evaluation_text("wikitext2"))


def test_dense_perplexity_on_first_windows(smollm2):
    model, _, ids = smollm2
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    result = perplexity(model, ids, seqlen=2048, windows=2, progress=False)
    # measured on this machine: 18.8375 (first 2 windows; 8 windows give 19.134)
    assert result.ppl == pytest.approx(18.8375, rel=2e-3)


def test_gguf_model_saves_as_plain_checkpoint(smollm2, tmp_path):
    from transformers import AutoConfig

    model, _, _ = smollm2
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert (tmp_path / "model.safetensors").is_file()


def test_short_structured_prune_keeps_model_working(smollm2):
    model, tokenizer, ids = smollm2
    state = {k: v.clone() for k, v in model.state_dict().items()}
    windows = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")), 2, 128, seed=0)
    try:
        before = perplexity(model, ids, seqlen=512, windows=1, progress=False).ppl
        report = prune(model, windows, PruneConfig(structure="structured", target_size=0.97, shots=1),
                       progress=False)
        after = perplexity(model, ids, seqlen=512, windows=1, progress=False).ppl
    finally:
        model.load_state_dict(state)
    shapes = [tuple(module.weight.shape) for block in prunable_layers(model) for _, module in block]
    assert_reaches_target(report.removed, shapes, 0.97, "structured", freed=report.shots[0].freed)
    assert before < after < 1.5 * before
    assert torch.isfinite(torch.tensor(after))
