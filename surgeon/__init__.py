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
    "RunConfig": "surgeon.config",
    "SurgeonError": "surgeon.errors",
    "load_model": "surgeon.model",
    "load_tokenizer": "surgeon.model",
    "evaluation_text": "surgeon.data",
    "calibration_text": "surgeon.data",
    "tokenize": "surgeon.data",
    "calibration_windows": "surgeon.data",
    "prune": "surgeon.shots",
    "PruneReport": "surgeon.report",
    "ShotReport": "surgeon.report",
    "perplexity": "surgeon.evaluate",
    "EvalResult": "surgeon.evaluate",
    "save_model": "surgeon.io",
    "load_compact": "surgeon.compact",
    "solve": "surgeon.solver",
    "Solution": "surgeon.solver",
}
__all__ = [
    "EvalResult", "PruneConfig", "PruneReport", "RunConfig", "ShotReport", "Solution", "SurgeonError", "__version__",
    "calibration_text", "calibration_windows", "evaluation_text", "load_compact", "load_model", "load_tokenizer",
    "perplexity", "prune", "save_model", "solve", "tokenize",
]

if TYPE_CHECKING:
    from surgeon.compact import load_compact
    from surgeon.config import PruneConfig, RunConfig
    from surgeon.data import calibration_text, calibration_windows, evaluation_text, tokenize
    from surgeon.errors import SurgeonError
    from surgeon.evaluate import EvalResult, perplexity
    from surgeon.io import save_model
    from surgeon.model import load_model, load_tokenizer
    from surgeon.report import PruneReport, ShotReport
    from surgeon.shots import prune
    from surgeon.solver import Solution, solve


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'surgeon' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
