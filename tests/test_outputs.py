"""Safe outputs: never over a user's files, checked before the work, atomic, with the user's umask."""

from __future__ import annotations

import os
import stat

import pytest

from surgeon.errors import SurgeonError
from surgeon.io import OutputDirectory, check_writable_file, save_model, write_json


@pytest.fixture
def umask_002():
    """Run with umask 002 (group-writable files), so a 0600 or 0644 file shows as wrong."""
    previous = os.umask(0o002)
    yield 0o002
    os.umask(previous)


def user_files(folder):
    (folder / "sub").mkdir(parents=True)
    (folder / "keepme.txt").write_text("mine")
    (folder / "sub" / "notes.md").write_text("notes")


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_refuses_a_non_empty_folder_and_keeps_its_files(tmp_path):
    user_files(tmp_path / "out")
    with pytest.raises(SurgeonError, match="not empty.*--overwrite"):
        OutputDirectory(tmp_path / "out")
    assert (tmp_path / "out" / "keepme.txt").read_text() == "mine"
    assert (tmp_path / "out" / "sub" / "notes.md").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing staged


def test_overwrite_replaces_only_what_the_run_writes(tmp_path):
    out = tmp_path / "out"
    user_files(out)
    (out / "report.json").write_text("old report")
    (out / "model.bin").write_text("old model")
    with OutputDirectory(out, overwrite=True) as output:
        (output.staging / "model.bin").write_text("new model")
        (output.staging / "report.json").write_text("new report")
        output.commit()
    assert (out / "keepme.txt").read_text() == "mine" and (out / "sub" / "notes.md").read_text() == "notes"
    assert (out / "model.bin").read_text() == "new model" and (out / "report.json").read_text() == "new report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_empty_existing_folder_is_accepted(tmp_path):
    (tmp_path / "out").mkdir()
    with OutputDirectory(tmp_path / "out") as output:
        (output.staging / "a.txt").write_text("a")
        output.commit()
    assert (tmp_path / "out" / "a.txt").read_text() == "a"


def test_a_failure_inside_leaves_nothing_and_the_old_result_untouched(tmp_path):
    out = tmp_path / "out"
    with OutputDirectory(out) as output:
        (output.staging / "report.json").write_text("first")
        output.commit()
    with pytest.raises(KeyboardInterrupt), OutputDirectory(out, overwrite=True) as output:
        (output.staging / "report.json").write_text("half")
        raise KeyboardInterrupt
    assert (out / "report.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging leftovers


@pytest.mark.parametrize("make", [OutputDirectory, check_writable_file])
def test_an_unwritable_output_fails_at_once(tmp_path, make):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # nothing can be created below a regular file, not even by root
    with pytest.raises(SurgeonError, match="a-file"):
        make(blocker / "out")


def test_outputs_follow_the_umask(tmp_path, umask_002):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    class Model:
        def save_pretrained(self, folder):  # safetensors itself writes 0600
            save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))

    out = save_model(tmp_path / "out", Model(), None, {"sparsity": 0.5})
    assert mode(out) == 0o775
    assert mode(out / "model.safetensors") == 0o664 and mode(out / "report.json") == 0o664
    write_json(tmp_path / "result.json", {"ppl": 1.0})
    assert mode(tmp_path / "result.json") == 0o664
