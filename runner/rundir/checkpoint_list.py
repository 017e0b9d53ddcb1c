"""A run's checkpoints folder as the driver reads it (``ddp-runs show``, a resume's check before launch, the run
``resume=last`` picks): the checkpoints a resume would load, the committed ones that fail their integrity check,
and every other ``step_<N>`` entry passed over with the reason (a stray file, a save that never committed, an
invalid marker).

The rules are the contract's (runner/contract/checkpoints.py): :func:`~ddp_runner.contract.checkpoints.commit_problem`,
the one the workers' storage lists by, then the size rule their load applies first. The driver never hashes (the
workers also compare sha256, and fall back past a checkpoint that fails): what it names as the newest is the one a
resume and ``ddp-export`` take unless its bytes were corrupted in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_runner.contract import checkpoints, layout

COMPLETE, FAILED, SKIPPED = "complete", "failed", "skipped"  # the verdicts of :func:`judge`


@dataclass(frozen=True)
class Listing:
    """``complete``: (step, name) of the checkpoints that pass, oldest first; ``failed``: (name, why) of the
    committed ones that fail their integrity check; ``skipped``: (name, why) of the other ``step_<N>`` entries."""

    complete: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def newest(self) -> str | None:
        """The newest complete checkpoint's name, None when there is none."""
        return self.complete[-1][1] if self.complete else None

    def notes(self) -> list[str]:
        """One note per entry passed over that is no checkpoint at all (the contract's words)."""
        return [checkpoints.skipped_note(name, why) for name, why in self.skipped]

    def failed_notes(self, doing: str = "continuing") -> list[str]:
        """One note per committed checkpoint newer than :attr:`newest` that fails its integrity check, in the words
        of a resume's fallback (``doing``: what is done from the newest that passes)."""
        newest = self.complete[-1][0] if self.complete else -1
        return [checkpoints.fallback_warning(name, why, self.newest, doing) if self.newest
                else checkpoints.skipped_note(name, f"it fails its integrity check: {why}")
                for name, why in self.failed if (checkpoints.step_of(name) or 0) > newest]


def _marker(fs: Any, folder: str) -> bytes | None:
    """The text of ``folder``'s meta.json, None when it has none."""
    try:
        return fs.cat_file(layout.join(folder, layout.CKPT_MARKER))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _size(fs: Any, path: str) -> int | None:
    try:
        return fs.size(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_local(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", ())
    return "file" in ((protocol,) if isinstance(protocol, str) else protocol)


def judge(fs: Any, folder: str, is_dir: bool = True) -> tuple[str, str | None]:
    """(:data:`COMPLETE`, None), (:data:`FAILED`, why) or (:data:`SKIPPED`, why) for the checkpoint folder at
    ``folder`` (a path on ``fs``): committed by a valid marker, and its ``state.pt`` of the size it records."""
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    if _is_local(fs) and (why := checkpoints.link_problem(folder)) is not None:
        return SKIPPED, why
    marker = _marker(fs, folder) if is_dir else None
    if (why := checkpoints.commit_problem(name, is_dir, marker)) is not None:
        return SKIPPED, why
    size = _size(fs, layout.join(folder, layout.CKPT_STATE))
    if (problem := checkpoints.size_problem(name, marker, size)) is not None:
        return FAILED, problem.removeprefix(f"{name}: ")
    return COMPLETE, None


def scan(fs: Any, ckpts: str) -> Listing:
    """The checkpoints folder at ``ckpts`` (a path on ``fs``); an empty listing when there is no such folder."""
    ckpts = ckpts.rstrip("/")
    fs.invalidate_cache(ckpts)  # an object store's cached listing may predate the last commit
    try:
        entries = fs.ls(ckpts, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return Listing()
    found: dict[str, list[tuple[int, str, str | None]]] = {COMPLETE: [], FAILED: [], SKIPPED: []}
    for entry in entries:
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if (step := checkpoints.step_of(name)) is None:
            continue  # a save's temporary sibling: the workers' business
        verdict, why = judge(fs, layout.join(ckpts, name), entry.get("type") == "directory")
        found[verdict].append((step, name, why))
    return Listing([(step, name) for step, name, _ in sorted(found[COMPLETE])],
                   [(name, str(why)) for _, name, why in sorted(found[SKIPPED])],
                   [(name, str(why)) for _, name, why in sorted(found[FAILED])])


def of_run(fs: Any, run: str) -> Listing:
    """The checkpoints folder of run directory ``run`` (a path on ``fs``)."""
    return scan(fs, layout.join(run.rstrip("/"), layout.CHECKPOINTS))
