"""Whether the Hugging Face hub can be reached, asked once per process with one short request.

Without it an offline lookup spends about a minute in the hub client's retries (a model) or half
a minute (a dataset) before failing. With `HF_HUB_OFFLINE=1` nothing is asked and only the local
cache is used, as in transformers and datasets.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_SECONDS = 3.0
OFFLINE_HINT = "set HF_HUB_OFFLINE=1 to use only the local cache without trying the hub"


def offline_mode() -> bool:
    """Whether the user asked for no hub access (`HF_HUB_OFFLINE`, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> str:
    """The hub address the clients use (`HF_ENDPOINT`, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


@functools.cache
def reachable() -> bool:
    """One HEAD request to the hub (proxies from the environment apply); any HTTP answer counts as reachable."""
    if offline_mode():
        return False
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint(), method="HEAD"), timeout=PROBE_SECONDS).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def unreachable_reason() -> str:
    """Why hub files cannot be fetched now, for an error or warning line."""
    if offline_mode():
        return "HF_HUB_OFFLINE is set, so only the local cache is used"
    return f"the Hugging Face hub ({endpoint()}) is unreachable; {OFFLINE_HINT}"


@contextlib.contextmanager
def cache_only_when_unreachable(asks_hub: bool = True) -> Iterator[None]:
    """Inside the block, transformers and datasets read only the local cache if the hub cannot be reached.

    Both read huggingface_hub's offline flag (datasets keeps a copy made when it is imported, so
    import it before the block); the flags are restored afterwards.
    """
    if not asks_hub or offline_mode() or reachable():
        yield
        return
    import huggingface_hub.constants

    holders: list[Any] = [huggingface_hub.constants]
    holders += [sys.modules[m] for m in ("datasets.config",) if m in sys.modules]
    saved = [holder.HF_HUB_OFFLINE for holder in holders]
    for holder in holders:
        holder.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for holder, value in zip(holders, saved):
            holder.HF_HUB_OFFLINE = value
