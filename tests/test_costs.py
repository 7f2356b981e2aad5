"""surgeon.method.costs: the numerators and costs of eq. 7."""

from __future__ import annotations

import pytest
import torch

from surgeon.method import costs
from surgeon.method.damping import damp
from tests._helpers import problem
from tests._tolerances import FLOAT64

SHAPES = [pytest.param(5, 7, id="R5-C7"), pytest.param(8, 3, id="R8-C3"), pytest.param(1, 6, id="R1-C6")]


@pytest.mark.parametrize("R,C", SHAPES)
def test_damped_quadratic_is_the_quadratic_form_of_the_damped_factor(R, C, gen):
    W, G, A = problem(R, C, gen)
    for strength in (0.0, 0.1, 3.0):
        rows = costs.damped_quadratic(((W @ A) * W).sum(1), W, A.diagonal(), strength, 1)
        torch.testing.assert_close(rows, ((W @ damp(A, strength)) * W).sum(1), **FLOAT64)
        cols = costs.damped_quadratic(((G @ W) * W).sum(0), W, G.diagonal(), strength, 0)
        torch.testing.assert_close(cols, ((damp(G, strength) @ W) * W).sum(0), **FLOAT64)
    assert not torch.allclose(costs.damped_quadratic(((W @ A) * W).sum(1), W, A.diagonal(), 0.5, 1),
                              ((W @ A) * W).sum(1))
