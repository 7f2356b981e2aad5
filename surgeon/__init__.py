"""surgeon: prune large language models with LLM Surgeon (van der Ouderaa et al., ICLR 2024).

Everything the README's Python example needs is importable from here::

    from surgeon import (PruneConfig, calibration_text, calibration_windows, evaluation_text, load_model,
                         perplexity, prune, save_model, solve, tokenize)

Names are imported on first use, so `import surgeon` (and `surgeon --help`) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "PruneConfig": "surgeon.config",
    "RunConfig": "surgeon.app.settings",
    "SurgeonError": "surgeon.errors",
    "load_model": "surgeon.models.adapter",
    "load_tokenizer": "surgeon.models.adapter",
    "evaluation_text": "surgeon.app.data",
    "calibration_text": "surgeon.app.data",
    "tokenize": "surgeon.app.data",
    "calibration_windows": "surgeon.app.data",
    "held_out_windows": "surgeon.app.data",
    "set_aside": "surgeon.app.data",
    "leading_token": "surgeon.app.data",
    "prune": "surgeon.pruning.shots",
    "PruneReport": "surgeon.pruning.report",
    "ShotReport": "surgeon.pruning.report",
    "perplexity": "surgeon.app.evaluate",
    "EvalResult": "surgeon.app.evaluate",
    "save_model": "surgeon.io",
    "load_compact": "surgeon.export.compact",
    "solve": "surgeon.method.solver",
    "Solution": "surgeon.method.solver",
}
__all__ = [
    "EvalResult", "PruneConfig", "PruneReport", "RunConfig", "ShotReport", "Solution", "SurgeonError", "__version__",
    "calibration_text", "calibration_windows", "evaluation_text", "held_out_windows", "leading_token", "load_compact",
    "load_model", "load_tokenizer", "perplexity", "prune", "save_model", "set_aside", "solve", "tokenize",
]

if TYPE_CHECKING:
    from surgeon.app.data import (
        calibration_text,
        calibration_windows,
        evaluation_text,
        held_out_windows,
        leading_token,
        set_aside,
        tokenize,
    )
    from surgeon.app.evaluate import EvalResult, perplexity
    from surgeon.app.settings import RunConfig
    from surgeon.config import PruneConfig
    from surgeon.errors import SurgeonError
    from surgeon.export.compact import load_compact
    from surgeon.io import save_model
    from surgeon.method.solver import Solution, solve
    from surgeon.models.adapter import load_model, load_tokenizer
    from surgeon.pruning.report import PruneReport, ShotReport
    from surgeon.pruning.shots import prune


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'surgeon' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
