"""Evaluation and calibration text."""

from __future__ import annotations

import pytest
import torch

from surgeon.app.data import (
    ARTICLE,
    Text,
    calibration_text,
    calibration_windows,
    evaluation_text,
    held_out_windows,
    set_aside,
    shared_passages,
    tokenize,
)
from surgeon.errors import SurgeonError


def test_wikitext2_test_text_matches_datasets_layout():
    text = evaluation_text("wikitext2")
    # datasets rows: "" then " = Robert Boulter = \n" then "" ...; joined with "\n\n"
    assert text.text.startswith("\n\n = Robert Boulter = \n\n\n\n\n Robert Boulter is an English film")
    assert text.text.count("\n\n") > 4000
    assert "packaged" in text.source


def test_packaged_validation_calibration():
    text = calibration_text("wikitext2-valid")
    assert "<unk>" in text.text and "wiki.valid.tokens" in text.source


def test_local_file_and_errors(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("hello world " * 10)
    assert calibration_text(str(path)).text.startswith("hello")
    with pytest.raises(SurgeonError, match="does not exist"):
        evaluation_text(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(SurgeonError, match="empty"):
        tokenize(None, evaluation_text(str(empty)))


def test_calibration_windows_are_seeded_windows_of_the_text():
    ids = torch.arange(1000).unsqueeze(0)
    a = calibration_windows(ids, 5, 64, seed=3)
    b = calibration_windows(ids, 5, 64, seed=3)
    c = calibration_windows(ids, 5, 64, seed=4)
    assert a.shape == (5, 64) and torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(5, 63, dtype=a.dtype))  # consecutive tokens
    with pytest.raises(SurgeonError, match="not more than one window"):
        calibration_windows(ids, 1, 1000, seed=0)


@pytest.fixture
def unreachable_hub(monkeypatch):
    """A hub at a closed loopback port, asked afresh; hub client warnings recorded too."""
    from surgeon.models import hub

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.reachable.cache_clear()
    yield
    hub.reachable.cache_clear()


def test_offline_calibration_falls_back_saying_so_once(unreachable_hub, caplog):
    import logging

    hub_logger = logging.getLogger("huggingface_hub")
    hub_logger.addHandler(caplog.handler)  # the hub client's retry warnings would land here
    try:
        with caplog.at_level(logging.WARNING):
            text = calibration_text("wikitext2")
    finally:
        hub_logger.removeHandler(caplog.handler)
    assert "wiki.valid.tokens" in text.source
    assert len(caplog.records) == 1, caplog.text
    assert "unreachable" in caplog.text and "HF_HUB_OFFLINE=1" in caplog.text


def test_offline_hub_dataset_is_one_clear_error(unreachable_hub):
    with pytest.raises(SurgeonError, match="'c4'.*unreachable"):
        calibration_text("c4")


def test_held_out_windows_are_the_first_windows_of_the_text_set_aside():
    ids = torch.arange(2000).unsqueeze(0)
    held = held_out_windows(ids, 48, 64)
    assert held.shape == (3, 64) and torch.equal(held.flatten(), torch.arange(3 * 64))  # one per 16, consecutive
    assert held_out_windows(ids, 1, 64).shape == (2, 64)  # at least two
    assert held_out_windows(torch.arange(127).unsqueeze(0), 8, 64) is None  # fewer tokens than two windows


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from surgeon.models.adapter import load_tokenizer

    return load_tokenizer("smollm2-135m")


def test_the_last_whole_articles_are_set_aside_where_no_calibration_window_reads_them(smollm2_tokenizer):
    """The fewest whole WikiText articles at the text's end that hold the tokens asked for; what the windows are drawn
    from is the text before them, and the two share no passage."""
    valid = calibration_text("wikitext2-valid")
    drawn, aside = set_aside(smollm2_tokenizer, valid, 20_000)
    assert aside is not None and drawn.text + aside.text == valid.text
    starts = [match.start() for match in ARTICLE.finditer(aside.text)]
    assert starts[0] == 0 and len(starts) > 1  # whole articles, more than one
    assert len(smollm2_tokenizer(aside.text).input_ids) > 20_000
    assert len(smollm2_tokenizer(aside.text[starts[1]:]).input_ids) <= 20_000  # the fewest that hold them
    assert shared_passages(aside, drawn) == 0 and "less its last" in drawn.source
    assert set_aside(smollm2_tokenizer, valid, len(smollm2_tokenizer(valid.text).input_ids) // 3) == (valid, None)


def test_a_text_without_articles_is_parted_at_a_paragraph_or_a_word(smollm2_tokenizer):
    paragraphs = Text("\n\n".join(f"paragraph {i} " + "word " * 50 for i in range(20)), "paragraphs")
    drawn, aside = set_aside(smollm2_tokenizer, paragraphs, 100)
    assert aside is not None and aside.text.startswith("paragraph 18 ")  # two paragraphs of 52 tokens and more
    words = Text("the " * 400, "words")
    drawn, aside = set_aside(smollm2_tokenizer, words, 50)
    assert aside is not None and aside.text.startswith("the ") and 50 < len(aside.text.split()) < 60
    assert set_aside(smollm2_tokenizer, Text("the " * 40, "short"), 64) == (Text("the " * 40, "short"), None)
    for asked in (35, 38, 40, 41, 44):  # about as many tokens as the text holds: refused, not searched for ever
        assert set_aside(smollm2_tokenizer, Text("the " * 40, "short"), asked)[1] is None
    few = Text("\n\n".join(f"paragraph {i} " + "word " * 50 for i in range(4)), "four paragraphs")
    assert set_aside(smollm2_tokenizer, few, 200)[1] is None


@pytest.mark.parametrize("name, bos", [("smollm2-135m", None),
                                       pytest.param("gemma3-270m", 2, marks=pytest.mark.slow)])
def test_windows_begin_as_the_tokenizer_begins_a_text(name, bos):
    """Gemma's tokenizer puts its BOS before every text, so each calibration and held-out window begins with it;
    SmolLM2's puts none, and its windows are the text's tokens."""
    from surgeon.app.data import leading_token
    from surgeon.models.adapter import load_tokenizer

    tokenizer = load_tokenizer(name)
    assert leading_token(tokenizer) == bos
    ids = torch.arange(3, 2003).unsqueeze(0)
    plain = calibration_windows(ids, 4, 64, seed=0)
    for windows, text in ((calibration_windows(ids, 4, 64, 0, bos), plain),
                          (held_out_windows(ids, 4, 64, bos), held_out_windows(ids, 4, 64))):
        assert torch.equal(windows[:, 1:], text[:, 1:])
        assert torch.equal(windows[:, 0], text[:, 0] if bos is None else torch.full((windows.shape[0],), bos))


def test_the_packaged_validation_and_test_splits_share_no_passage_and_a_copy_is_found():
    """Calibration and held-out windows come from text no reported perplexity reads; a passage of the test text is
    found however it is tokenised (WikiText's token files write <unk> where its raw files keep the word)."""
    valid, test = calibration_text("wikitext2-valid"), evaluation_text("wikitext2")
    assert shared_passages(valid, test) == 0
    lines = [line for line in test.text.splitlines() if len(line.split()) > 40][:5]
    unknown = [" ".join("<unk>" if i % 20 == 3 else word for i, word in enumerate(line.split())) for line in lines]
    copied = Text(valid.text + "\n" + "\n".join(unknown), "valid with five test passages")
    assert shared_passages(copied, test) == 5


def test_the_benchmark_calibrates_and_tunes_on_text_the_reported_perplexity_never_reads():
    from bench.quality import table

    assert shared_passages(calibration_text(table.CALIBRATION), evaluation_text(table.EVALUATION)) == 0
    assert table.load_protocol.__code__.co_names.count("CALIBRATION") == 1  # every window the bench draws is of it


def test_the_benchmark_calibrates_weighs_and_tunes_on_apart_articles(monkeypatch, smollm2_tokenizer):
    """No run of 32 tokens is in two of the bench's calibration, held-out and tuning windows."""
    from bench.quality import table

    monkeypatch.setattr(table, "load_model", lambda name: (torch.nn.Linear(1, 1), smollm2_tokenizer))
    protocol = table.load_protocol("smollm2-135m", 64, 512)
    assert protocol.held_out.shape == (4, 512) and protocol.tuning_ids.shape[1] > table.TUNING_TOKENS

    def runs(ids: torch.Tensor) -> set[int]:
        return {hash(tuple(row[i:i + 32])) for row in ids.tolist() for i in range(len(row) - 31)}

    calibration, held_out, tuning = runs(protocol.windows), runs(protocol.held_out), runs(protocol.tuning_ids)
    assert not calibration & held_out and not calibration & tuning and not held_out & tuning


def test_a_no_bos_row_calibrates_and_weighs_on_windows_as_drawn_and_evaluates_with_bos():
    """The candidate against the BOS rule changes the calibration and held-out windows only: the seed's windows at
    the same starts, each with the token it was drawn with; test and tuning windows still begin with BOS."""
    from bench.quality import table

    ids, aside = torch.arange(100, 1100).reshape(1, -1), torch.arange(2000, 3000).reshape(1, -1)
    run = table.Protocol(None, {}, None, ids, ids, ids, 7, calibration_windows(ids, 4, 64, 0, 7),
                         held_out_windows(aside, 4, 64, 7), aside=aside).with_seed(3)
    plain = run.without_bos()
    assert (run.windows[:, 0] == 7).all() and (run.held_out[:, 0] == 7).all()
    assert torch.equal(plain.windows, calibration_windows(ids, 4, 64, 3)) and not (plain.windows[:, 0] == 7).any()
    assert torch.equal(plain.windows[:, 1:], run.windows[:, 1:])
    assert torch.equal(plain.held_out, held_out_windows(aside, 4, 64)) and plain.bos == 7 and plain.seed == 3
    assert run.with_seed(3) is run and torch.equal(run.with_seed(0).windows, calibration_windows(ids, 4, 64, 0, 7))
    defaults = dict(table.defaults_rows())  # each default row without BOS runs the CLI's defaults
    assert table.runnable_rows(4, 4)["unstructured-0.5-surgeon" + table.NO_BOS] == defaults["unstructured-0.5-surgeon"]


def test_a_run_calibrated_on_its_evaluation_text_is_refused_before_the_model_loads(tmp_path, capsys):
    from surgeon.app.cli import main

    copy = tmp_path / "test.txt"
    copy.write_text(evaluation_text("wikitext2").text[:200_000])
    assert main(["prune", "--model", str(tmp_path / "no-model-needed"), "--calibration", str(copy), "--output",
                 str(tmp_path / "out")]) == 2
    assert "shares" in capsys.readouterr().err and not (tmp_path / "out").exists()  # not the missing model


def test_any_hub_dataset_streams_its_column_until_enough_text(monkeypatch):
    from surgeon.app import data

    calls = []

    def load_dataset(path, config, split, streaming):
        calls.append((path, config, split, streaming))
        return iter([{"body": "x" * 6, "id": 1}] * 10)

    monkeypatch.setattr(data, "STREAMED_CHARACTERS", 20)
    text = data._load_hub_split(load_dataset, "hf:org/set:en:validation:body", "train")
    assert calls == [("org/set", "en", "validation", True)]
    assert text.text == "\n\n".join(["x" * 6] * 4) and "hf:org/set" in text.source  # 24 characters: enough
    with pytest.raises(SurgeonError, match="no column 'text' .*body, id"):
        data._load_hub_split(lambda *args, **kwargs: iter([{"body": "x", "id": 1}]), "hf:org/set", "train")
