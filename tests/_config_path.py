"""Where a run's `PruneConfig` travels below `surgeon.prune`: the files a reader follows it through.

Tiny models are pruned (a Llama structured, coupled, unstructured with its held-out choice and 2:4; a Mixtral's
whole experts) while a profiler records each call of a `surgeon` function that holds the configuration, as an
argument or as an attribute of one (the configuration's own methods aside), and the nearest such caller. Walking
that call tree depth first, each function once, in the order of its first call, the reader enters a file each time
the walk moves to another file, on the way down or back: `visits` counts those entries, `files` the distinct files,
`returns` the entries into a file already left.

    python -m tests._config_path      # JSON: files, visits, returns and the walk
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (("llama", {"structure": "structured", "target_size": 0.8, "shots": 2}),
            ("llama", {"structure": "coupled", "target_size": 0.8}),
            ("llama", {"structure": "unstructured", "target_size": 0.5}),
            ("llama", {"structure": "2:4"}),
            ("mixtral", {"structure": "experts", "target_size": 0.5}))


def config_path() -> dict[str, Any]:
    """The files, visits, returns and walk of the configuration through `prune` on `SETTINGS`."""
    from surgeon import PruneConfig, prune
    from tests._families import VOCAB, family_model

    package = str(ROOT / "surgeon")
    calls: dict[CodeType | None, list[CodeType]] = {}

    for family, settings in SETTINGS:
        config = PruneConfig(**settings)

        def holds(frame: FrameType, config: PruneConfig = config) -> bool:
            return frame.f_code.co_filename.startswith(package) and frame.f_locals.get("self") is not config and any(
                value is config or any(item is config for item in getattr(value, "__dict__", {}).values())
                for value in frame.f_locals.values())

        def profile(frame: FrameType, event: str, arg: object, holds: Any = holds) -> None:
            if event != "call" or not holds(frame):
                return
            caller = frame.f_back
            while caller is not None and not holds(caller):
                caller = caller.f_back
            callees = calls.setdefault(None if caller is None else caller.f_code, [])
            if frame.f_code not in callees:
                callees.append(frame.f_code)

        model = family_model(family)
        ids = torch.randint(3, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
        sys.setprofile(profile)
        try:
            prune(model, ids[:3], config, progress=False, held_out_ids=ids[3:])
        finally:
            sys.setprofile(None)

    def file_of(code: CodeType) -> str:
        return str(Path(code.co_filename).relative_to(ROOT))

    walk: list[str] = []
    seen: set[CodeType] = set()

    def follow(code: CodeType | None) -> None:
        here = walk[-1] if walk else None
        for callee in calls.get(code, []):
            if callee in seen:
                continue
            seen.add(callee)
            if not walk or file_of(callee) != walk[-1]:
                walk.append(file_of(callee))
            follow(callee)
            if here is not None and walk[-1] != here:
                walk.append(here)

    follow(None)
    return {"files": len(set(walk)), "visits": len(walk), "returns": len(walk) - len(set(walk)), "walk": walk}


if __name__ == "__main__":
    print(json.dumps(config_path(), indent=1))
