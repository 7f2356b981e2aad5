"""Safe outputs: a result appears whole or not at all, never over a user's files, with the user's umask.

`OutputDirectory` is checked and staged before any work (a folder that cannot be written fails
in a second, not after an hour of pruning), filled in a hidden sibling, and moved into place at
the end. `write_json` replaces one file atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from surgeon.errors import SurgeonError

# Written last on commit (and removed first when overwriting): a folder holding it is complete.
COMPLETE_MARKER = "report.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _apply_umask(folder: Path) -> None:
    """Give every file and folder under `folder` the permissions the user's umask gives new ones.

    Some writers (safetensors) create files with mode 0600, which other users of a shared model
    folder could not read.
    """
    mask = _umask()
    for root, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def _describe(error: OSError) -> str:
    return error.strerror or str(error)


def _make_parent(target: Path) -> None:
    """Create the folder that will hold `target`, or fail in one line naming it."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SurgeonError(f"cannot create the folder {str(target.parent)!r} for {str(target)!r}: "
                           f"{_describe(error)}") from error


def check_writable_file(path: str | os.PathLike[str]) -> None:
    """Fail now, in one line, if a file cannot be created at `path` (folder missing, read-only, a file)."""
    target = Path(path)
    if target.is_dir():
        raise SurgeonError(f"output {str(target)!r} is a folder; give a file name")
    _make_parent(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as error:
        raise SurgeonError(f"cannot write {str(target)!r}: {_describe(error)}") from error
    os.close(fd)
    os.unlink(tmp)


def read_run(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The report of a finished `surgeon prune` output folder, or a SurgeonError saying it is not one."""
    path = Path(folder) / COMPLETE_MARKER
    if not path.is_file():
        raise SurgeonError(f"{str(folder)!r} is not a `surgeon prune` output folder (it has no {COMPLETE_MARKER})")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write `data` as JSON to `path` atomically (a temporary file in the same folder, then a rename)."""
    target = Path(path)
    _make_parent(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the result gets the usual permissions
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


class OutputDirectory:
    """A run's output folder: checked and staged on creation, filled in `.staging`, moved on `commit()`.

    `path` must be new or an empty folder; with `overwrite=True` an existing folder's other files
    are kept and only the entries the run writes are replaced. Used as a context manager, the
    staging folder is removed when the block raises (an error, Ctrl-C, SIGTERM), so nothing that
    looks like a finished result is left.
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise SurgeonError(f"output {str(self.path)!r} exists and is not a folder")
        if self.path.is_dir() and any(self.path.iterdir()) and not overwrite:
            raise SurgeonError(f"output folder {str(self.path)!r} is not empty; choose a new folder, or pass "
                               "--overwrite to replace only the files this run writes")
        _make_parent(self.path)
        try:
            staging = tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as error:
            raise SurgeonError(f"cannot write the output folder {str(self.path)!r}: {_describe(error)}") from error
        self.staging = Path(staging)
        self._keep_staging = False
        os.chmod(self.staging, 0o777 & ~_umask())  # mkdtemp makes 0700

    def __enter__(self) -> OutputDirectory:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is not None and not self._keep_staging:
            self.discard()

    def discard(self) -> None:
        """Remove the staging folder and everything in it."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def commit(self) -> Path:
        """Move the staged files into place and return the output path.

        A new or empty target receives the staging folder by one rename. Into a non-empty target
        (`overwrite`) each entry is renamed over its namesake, `COMPLETE_MARKER` removed first and
        moved last, so an interrupted commit never leaves a folder that looks complete.
        """
        try:
            _apply_umask(self.staging)
            if not self.path.exists() or not any(self.path.iterdir()):
                os.replace(self.staging, self.path)
                return self.path
            marker = self.path / COMPLETE_MARKER
            if marker.is_file() or marker.is_symlink():
                marker.unlink()
            entries = sorted(self.staging.iterdir(), key=lambda entry: entry.name == COMPLETE_MARKER)
            for entry in entries:
                destination = self.path / entry.name
                if destination.is_dir() and not destination.is_symlink():
                    shutil.rmtree(destination)
                os.replace(entry, destination)
            self.discard()
            return self.path
        except OSError as error:
            self._keep_staging = True
            raise SurgeonError(f"cannot move the result into {str(self.path)!r}: {_describe(error)}; "
                               f"it is complete in {str(self.staging)!r}") from error


def write_checkpoint(folder: Path, model: Any, tokenizer: Any, report: dict[str, Any] | None = None,
                     state_dict: dict[str, Any] | None = None) -> None:
    """Write a Hugging Face checkpoint (`save_pretrained` of model and tokenizer) and `report.json` into `folder`.

    state_dict: the weights to write instead of the model's own (e.g. gathered whole from shards).
    """
    if state_dict is None:
        model.save_pretrained(folder)
    else:
        model.save_pretrained(folder, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if report is not None:
        write_json(folder / COMPLETE_MARKER, report)


def save_model(path: str | os.PathLike[str], model: Any, tokenizer: Any = None, report: dict[str, Any] | None = None,
               overwrite: bool = False) -> Path:
    """Save a pruned model where `AutoModelForCausalLM.from_pretrained(path)` loads it, all at once.

    `path` must be new or an empty folder unless `overwrite` (then only the files written here are
    replaced); `report` (e.g. `PruneReport.to_dict()`) is saved as report.json. Returns the path.
    """
    with OutputDirectory(path, overwrite) as output:
        write_checkpoint(output.staging, model, tokenizer, report)
        return output.commit()
