"""The Python API: what `surgeon` exports, argument checks that name the argument, silence on request,
and the README's example run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from surgeon import PruneConfig, prune
from surgeon.method import solver
from tests._helpers import random_spd, tiny_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "prune_and_save.py"


def calibration(n: int = 2, length: int = 16) -> torch.Tensor:
    return torch.randint(0, 96, (n, length), generator=torch.Generator().manual_seed(0))


def test_exports_what_the_readme_example_uses():
    import surgeon.pruning.shots  # a submodule of the same name must not shadow the function

    for name in ("PruneConfig", "load_model", "tokenize", "calibration_text", "evaluation_text",
                 "calibration_windows", "prune", "perplexity", "save_model", "PruneReport", "SurgeonError"):
        assert name in surgeon.__all__ and callable(getattr(surgeon, name)), name
    assert surgeon.prune is surgeon.pruning.shots.prune


@pytest.mark.parametrize("bad,error,message", [
    (torch.arange(16), ValueError, r"calibration_ids must have shape \[n, seqlen\]"),
    ([[1, 2, 3, 4]], TypeError, "calibration_ids must be a torch.LongTensor"),
    (torch.rand(2, 16), TypeError, "calibration_ids must hold integer token ids"),
    (torch.full((2, 16), 96), ValueError, "outside the model's vocabulary"),
])
def test_prune_names_a_bad_calibration_argument(bad, error, message):
    with pytest.raises(error, match=message):
        prune(tiny_model("llama"), bad, PruneConfig(shots=1), progress=False)
    with pytest.raises(error, match=message.replace("calibration_ids", "held_out_ids")):
        prune(tiny_model("llama"), calibration(), PruneConfig(structure="2:4"), progress=False, held_out_ids=bad)


def test_prune_names_a_bad_model_or_config():
    with pytest.raises(TypeError, match="model must be a transformers causal LM"):
        prune(nn.Linear(4, 4), calibration(), PruneConfig(shots=1), progress=False)
    with pytest.raises(TypeError, match="config must be a surgeon.PruneConfig"):
        prune(tiny_model("llama"), calibration(), {"shots": 1}, progress=False)  # type: ignore[arg-type]


def test_nm_target_size_is_its_own_or_refused():
    assert PruneConfig(structure="2:4").target == 0.5
    assert PruneConfig(structure="2:4", target_size=0.5).target == 0.5
    assert PruneConfig(structure="structured").target == 0.8
    with pytest.raises(ValueError, match="structure 3:4 keeps 0.75"):
        PruneConfig(structure="3:4", target_size=0.9)


def test_progress_false_is_silent(capfd):
    prune(tiny_model("opt"), calibration(), PruneConfig(structure="structured", shots=2), progress=False)
    prune(tiny_model("llama"), calibration(), PruneConfig(structure="unstructured", method="sparsegpt",
                                                          target_size=0.5, shots=1), progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_structured_update_takes_masks_or_indices(gen):
    R, C = 7, 9
    W = torch.randn(R, C, generator=gen, dtype=torch.float64)
    G, A = random_spd(R, gen), random_spd(C, gen)
    rows, cols = torch.tensor([1, 4]), torch.tensor([0, 5, 8])
    row_mask = torch.zeros(R, dtype=torch.bool).index_fill_(0, rows, True)
    col_mask = torch.zeros(C, dtype=torch.bool).index_fill_(0, cols, True)
    by_index = solver.structured_update(W, G, A, rows, cols)
    assert torch.equal(solver.structured_update(W, G, A, row_mask, col_mask), by_index)
    assert torch.equal(solver.structured_update(W, G, A, [4, 1], [8, 0, 5]), by_index)
    assert (by_index[rows] == 0).all() and (by_index[:, cols] == 0).all()


@pytest.mark.parametrize("rows,error,message", [
    (torch.zeros(5, dtype=torch.bool), ValueError, r"rows as a boolean mask must have shape \[7\]"),
    (torch.tensor([0, 7]), ValueError, r"rows holds indices outside \[0, 7\)"),
    (torch.tensor([1, 1]), ValueError, "rows holds repeated indices"),
    (torch.tensor([0.5]), TypeError, "rows must be a boolean mask"),
])
def test_structured_update_names_bad_arguments(gen, rows, error, message):
    W = torch.randn(7, 9, generator=gen, dtype=torch.float64)
    with pytest.raises(error, match=message):
        solver.structured_update(W, random_spd(7, gen), random_spd(9, gen), rows, [0])
    with pytest.raises(ValueError, match="so G must be 7×7"):
        solver.structured_update(W, random_spd(9, gen), random_spd(9, gen), [0], [0])


def readme_python_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return next(block for block in blocks if "save_model" in block)


@pytest.mark.slow
def test_readme_example_runs_as_written(tmp_path):
    code = readme_python_block()
    assert code.strip() in EXAMPLE.read_text()  # the README shows the example file's code
    result = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"perplexity [\d.]+ -> [\d.]+, sparsity 0\.2\d\d\n", result.stdout)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2-structured80")
