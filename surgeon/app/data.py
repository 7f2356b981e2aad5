"""Text for evaluation and calibration: packaged WikiText-2, `datasets` hub sets, local files.

WikiText-2 test text ships with the package (`surgeon/data/wikitext-2`, attribution in the
README there), so evaluation on it needs no network. Calibration on `wikitext2` uses the train
split through `datasets` when the hub is reachable and otherwise the packaged validation split
(`wiki.valid.tokens`); the source actually used is returned so reports can state it. The last whole
articles of a calibration text are set aside for the held-out choice (`set_aside`), so that no calibration
window reads them, whatever the budget.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from surgeon.errors import SurgeonError, first_line
from surgeon.models import hub

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

PACKAGED = Path(__file__).parents[1] / "data" / "wikitext-2"
HUB_SETS = ("wikitext2", "c4", "ptb")
ARTICLE = re.compile(r"^ = [^=].* = $", re.MULTILINE)  # a WikiText article's heading; ` = = Section = = ` begins none
STREAMED_CHARACTERS = 20_000_000  # of a streamed hf: dataset: about 5M tokens, beyond any default budget


@dataclass(frozen=True)
class Text:
    """A text and a description of where it came from."""

    text: str
    source: str


def _rows_text(lines: list[str]) -> str:
    """Join WikiText lines as the `datasets` rows are joined by the standard protocol."""
    rows = ["" if line.strip() == "" else line + "\n" for line in lines]
    return "\n\n".join(rows)


def _packaged(filename: str) -> Text:
    path = PACKAGED / filename
    return Text(_rows_text(path.read_text(encoding="utf-8").split("\n")[:-1]), f"wikitext2:{filename} (packaged)")


def _hub(name: str, split: str) -> Text:
    """Load a hub dataset split with `datasets` and join it as SparseGPT/LLM Surgeon do."""
    try:
        from datasets import load_dataset
    except ImportError as error:
        raise SurgeonError(f"dataset {name!r} needs the `datasets` package: pip install datasets") from error
    try:
        with hub.cache_only_when_unreachable():
            return _load_hub_split(load_dataset, name, split)
    except Exception as error:  # noqa: BLE001 - datasets raises many types for an unreachable hub
        where = hub.unreachable_reason() if not hub.reachable() else first_line(error)[:200]
        raise SurgeonError(f"cannot load dataset {name!r} split {split!r} from the hub: {where}") from error


def _load_hub_split(load_dataset: Callable[..., Any], name: str, split: str) -> Text:
    """One split of a hub text set, its rows joined as SparseGPT and LLM Surgeon join them; or, for
    `hf:PATH[:CONFIG[:SPLIT[:COLUMN]]]`, any dataset `datasets` loads, streamed until `STREAMED_CHARACTERS`."""
    if name.startswith("hf:"):
        path, config, split, column = (name[3:].split(":") + ["", "", ""])[:4]
        stream = load_dataset(path, config or None, split=split or "train", streaming=True)
        rows, size = [], 0
        for row in stream:
            if size >= STREAMED_CHARACTERS:
                break
            if (column or "text") not in row:
                raise SurgeonError(f"{name}: the rows have no column {column or 'text'!r} (they have "
                                   f"{', '.join(row)}): name it as hf:PATH:CONFIG:SPLIT:COLUMN")
            rows.append(str(row[column or "text"]))
            size += len(rows[-1])
        return Text("\n\n".join(rows), f"{name} (hub, first {size} characters)")
    if name == "wikitext2":
        rows = load_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"]
        return Text("\n\n".join(rows), f"wikitext2:{split} (hub)")
    if name == "ptb":
        rows = load_dataset("ptb_text_only", "penn_treebank", split=split)["sentence"]
        return Text(" ".join(rows), f"ptb:{split} (hub)")
    shard = "train.00000-of-01024" if split == "train" else "validation.00000-of-00008"
    rows = load_dataset("allenai/c4", data_files={split: f"en/c4-{shard}.json.gz"}, split=split)["text"]
    return Text(" ".join(rows[:1100] if split != "train" else rows), f"c4:{split} (hub)")


def _file(path_name: str) -> Text:
    path = Path(path_name).expanduser()
    if not path.is_file():
        raise SurgeonError(f"text file {path_name!r} does not exist (datasets: {', '.join(HUB_SETS)})")
    try:
        return Text(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as error:
        raise SurgeonError(f"cannot read text file {path_name!r}: {error}") from error


def evaluation_text(name: str) -> Text:
    """The evaluation text of `name` (wikitext2, c4, ptb) or of a local file."""
    if name == "wikitext2":
        return _packaged("wiki.test.raw")
    if name in ("c4", "ptb"):
        return _hub(name, "validation" if name == "c4" else "test")
    return _file(name)


def calibration_text(name: str) -> Text:
    """The calibration text of `name`: hub train split, packaged fallback, or a local file.

    `wikitext2-valid` names the packaged validation split directly (no hub lookup).
    """
    if name == "wikitext2-valid":
        return _packaged("wiki.valid.tokens")
    if name in HUB_SETS or name.startswith("hf:"):
        try:
            return _hub(name, "train")
        except SurgeonError as error:
            if name != "wikitext2":
                raise
            logger.warning("%s; calibrating on the packaged wikitext2 validation split instead", error)
            return _packaged("wiki.valid.tokens")
    return _file(name)


def _grams(line: str, size: int) -> list[int]:
    """Hashes of the runs of `size` consecutive words of `line` that hold no unknown-word marker (`<unk>`, which
    WikiText's token files put where its raw files keep the word)."""
    words = line.split()
    return [hash(" ".join(words[i:i + size])) for i in range(len(words) - size + 1)
            if "<unk>" not in words[i:i + size]]


def shared_passages(text: Text, other: Text, size: int = 8) -> int:
    """How many passages (lines of at least 2·`size` words) of `text` have at least half of their runs of `size`
    words in `other`: text drawn from `other`, whatever its tokenisation (WikiText's raw or token files) or split."""
    seen = {gram for line in other.text.splitlines() for gram in _grams(line, size)}
    count = 0
    for line in text.text.splitlines():
        grams = _grams(line, size) if len(line.split()) >= 2 * size else []
        if grams and 2 * sum(gram in seen for gram in grams) >= len(grams):
            count += 1
    return count


def tokenize(tokenizer: PreTrainedTokenizerBase, text: Text) -> torch.Tensor:
    """Token ids [1, T] of a whole text; empty text is an error."""
    if not text.text.strip():
        raise SurgeonError(f"text from {text.source} is empty")
    ids: torch.Tensor = tokenizer(text.text, return_tensors="pt").input_ids
    return ids


def leading_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token the tokenizer puts before every text, its BOS (Gemma, Llama, OPT's `</s>`), or None (SmolLM2's
    tokenizer puts none)."""
    ids: list[int] = tokenizer("").input_ids
    return ids[0] if len(ids) == 1 and ids[0] == tokenizer.bos_token_id else None


def _windows(ids: torch.Tensor, starts: list[int], seqlen: int, bos: int | None) -> torch.Tensor:
    """The windows [len(starts), seqlen] of `ids` [1, T] at `starts`; with `bos`, each one's first token is it, as
    every input the model is trained on and used with begins."""
    windows = torch.stack([ids[0, s : s + seqlen] for s in starts])
    if bos is not None:
        windows[:, 0] = bos
    return windows


def _window_starts(total: int, seqlen: int, seed: int) -> Iterator[int]:
    """The seeded random starts of windows of `seqlen` tokens in a text of `total`, drawn one after another."""
    rng = random.Random(seed)
    while True:
        yield rng.randint(0, total - seqlen - 1)


def calibration_windows(ids: torch.Tensor, nsamples: int, seqlen: int, seed: int, bos: int | None = None
                        ) -> torch.Tensor:
    """`nsamples` random windows [nsamples, seqlen] of consecutive tokens, seeded (as in the paper); with `bos`
    (`leading_token`), each window begins with it instead of its first token, as the model's inputs begin."""
    total = ids.shape[1]
    if total <= seqlen:
        raise SurgeonError(f"calibration text has {total} tokens, not more than one window of {seqlen}")
    starts = list(itertools.islice(_window_starts(total, seqlen, seed), nsamples))
    return _windows(ids, starts, seqlen, bos)


def held_out_count(nsamples: int) -> int:
    """How many windows the held-out choice scores beside `nsamples` calibration windows: one per 16, at least 2."""
    return max(2, nsamples // 16)


def held_out_windows(ids: torch.Tensor, nsamples: int, seqlen: int, bos: int | None = None) -> torch.Tensor | None:
    """The first `held_out_count(nsamples)` consecutive windows [count, seqlen] of `ids` [1, T], the text set aside
    from calibration (`set_aside`), each begun with `bos` as the calibration windows are; None where it holds fewer."""
    count = held_out_count(nsamples)
    if ids.shape[1] < count * seqlen:
        return None
    return windows_of(ids, seqlen, count, bos)


def windows_of(ids: torch.Tensor, seqlen: int, count: int, bos: int | None = None) -> torch.Tensor:
    """The first `count` consecutive windows [count, seqlen] of `ids` [1, T], each begun with `bos` where given."""
    return _windows(ids, [i * seqlen for i in range(count)], seqlen, bos)


def _start_before(text: str, position: int, articles: list[int]) -> int:
    """The last article start in `articles` at or before `position` (> 0); in a text without articles, the last
    paragraph, line or word start; 0 where there is none."""
    if articles:
        return max((start for start in articles if start <= position), default=0)
    for separator in ("\n\n", "\n", " "):
        found = text.rfind(separator, 0, position)
        if found > 0:
            return found + len(separator)
    return 0


def set_aside(tokenizer: PreTrainedTokenizerBase, text: Text, tokens: int) -> tuple[Text, Text | None]:
    """`text` parted at an article start (WikiText's ` = Title = ` headings; in a text with fewer than two, a
    paragraph, line or word) into what comes before it and the fewest whole articles at its end that hold more than
    `tokens` tokens, which no window drawn from the first part reads; the whole text and None where those would be
    more than a quarter of it."""
    body = text.text
    articles = [match.start() for match in ARTICLE.finditer(body)]
    articles = articles if len(articles) > 1 else []

    def count(start: int) -> int:
        return len(tokenizer(body[start:]).input_ids)

    sample = body[-200_000:]
    chars_per_token = len(sample) / max(1, len(tokenizer(sample).input_ids))
    position, held = len(body), 0
    while held <= tokens:  # back by the missing tokens' characters, to the start before
        target = position - max(1, int((tokens + 1 - held) * chars_per_token * 1.05))
        position = _start_before(body, target, articles) if target > 0 else 0
        if 4 * position < 3 * len(body):
            return text, None
        held = count(position)
    for start in (start for start in articles if start > position):  # the fewest: drop an article the rest can spare
        if (rest := count(start)) <= tokens:
            break
        position, held = start, rest
    return (Text(body[:position], f"{text.source}, less its last {held} tokens"),
            Text(body[position:], f"{text.source}, its last {held} tokens"))
