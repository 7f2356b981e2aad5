"""surgeon: prune large language models with LLM Surgeon (van der Ouderaa et al., ICLR 2024)."""

from surgeon.config import PruneConfig, RunConfig
from surgeon.errors import SurgeonError

__all__ = ["PruneConfig", "RunConfig", "SurgeonError"]
__version__ = "0.1.0"

from surgeon.prune import prune  # noqa: E402

__all__.append("prune")
