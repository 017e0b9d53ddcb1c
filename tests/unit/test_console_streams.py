"""Console streams that never end the program writing them (runner/contract/console_streams.py): a reader that went
away (``| head``) and a console without ``×`` (``PYTHONIOENCODING=ascii``) cost nothing but the lost output."""

from __future__ import annotations

import importlib
import io
import os
import sys
from pathlib import Path

import pytest

from ddp_runner.contract import console_streams
from tests.support.doc_commands import scripts


def _closed_pipe() -> int:
    """The write end of a pipe whose reader has gone."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_guarded_stream_survives_its_reader_and_then_writes_to_the_null_device() -> None:
    """A stream over a pipe whose reader has gone: writing and flushing raise nothing (an unguarded one raises
    BrokenPipeError), and its descriptor then leads to the null device."""
    fd = _closed_pipe()
    with pytest.raises(BrokenPipeError):
        with open(fd, "w", closefd=False) as plain:
            plain.write("line\n" * 10_000)
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w")), encoding="utf-8")
    guarded = console_streams._guarded(stream)
    assert guarded is not stream
    guarded.write("step 1/8\n" * 10_000)
    guarded.flush()
    guarded.write("step 2/8\n")
    guarded.flush()
    assert console_streams.leads_nowhere(fd)
    assert console_streams._guarded(guarded) is guarded  # guarding twice changes nothing
    guarded.close()
    stream.close()  # it owns the descriptor


def test_a_forgiving_console_goes_on_in_its_fallback_after_one_note(tmp_path: Path) -> None:
    """Rank 0's console (tasks/engine/reporting/progress.py): once its reader has gone, the lines go on where
    ``reroute`` points the descriptor (the rank log), after the note, and none is lost."""
    log = tmp_path / "rank0.log"
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    console = console_streams.forgiving(_closed_pipe(), lambda fd: os.dup2(log_fd, fd), "console gone\n")
    for step in range(1, 4):
        console.write(f"step {step}/3\n")
    console.close()
    os.close(log_fd)
    assert log.read_text() == "console gone\nstep 1/3\nstep 2/3\nstep 3/3\n"


def test_a_console_that_is_the_null_device_goes_to_its_fallback_from_the_first_line(tmp_path: Path) -> None:
    """``ddp-run … > /dev/null``, or a driver whose reader went away before the launch (the ranks inherit the null
    device): rank 0's console lines are kept in its log all the same."""
    log = tmp_path / "rank0.log"
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    console = console_streams.forgiving(os.open(os.devnull, os.O_WRONLY), lambda fd: os.dup2(log_fd, fd), "gone\n")
    console.write("step 1/1\n")
    console.close()
    os.close(log_fd)
    assert log.read_text() == "gone\nstep 1/1\n"


@pytest.mark.parametrize(("text", "shown"), [
    ("8 per rank × 2 ranks", "8 per rank x 2 ranks"), ("failed ⚠", "failed !"), ("a — b", "a - b"),
    ("checking …", "checking ..."), ("resume → step_4", "resume -> step_4"), ("━━━╸   ", "----   "),
    ("▇ ⠋", "# *"), ("café", "cafe"), ("α", "?"),
])
def test_an_ascii_console_gets_plain_ascii_counterparts(text: str, shown: str) -> None:
    """Each character an ASCII stream cannot encode is written as its counterpart, never a UnicodeEncodeError."""
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding="ascii", errors=console_streams.ERRORS)
    stream.write(text)
    stream.flush()
    assert buffer.getvalue().decode("ascii") == shown


def test_a_guarded_ascii_stream_falls_back_and_a_utf8_one_keeps_its_errors() -> None:
    """Guarding sets the fallback only where the encoding lacks characters: a UTF-8 console's own error handling
    (surrogateescape for undecodable file names) stays."""
    read, write = os.pipe()
    ascii_out = console_streams._guarded(open(write, "w", encoding="ascii", errors="strict"))
    ascii_out.write("global batch 16 = 8 × 2\n")
    ascii_out.flush()
    assert os.read(read, 100) == b"global batch 16 = 8 x 2\n"
    utf8_out = console_streams._guarded(open(os.dup(write), "w", encoding="utf-8", errors="surrogateescape"))
    assert utf8_out.errors == "surrogateescape"
    for stream in (ascii_out, utf8_out):
        stream.close()
    os.close(read)


def test_guard_leaves_a_captured_stream_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream a caller put in place (a test's capture, ``contextlib.redirect_stdout``) is not replaced."""
    captured = io.StringIO()
    monkeypatch.setattr("sys.stdout", captured)
    console_streams.guard()
    assert sys.stdout is captured


class _Guarded(Exception):
    pass


@pytest.mark.parametrize("script", sorted(scripts()))
def test_every_console_script_guards_its_streams_first(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ddp-run, ddp-runs, ddp-compare, ddp-doctor, ddp-tokenize and ddp-export each guard their streams before
    anything else (before a word of ``--help`` is printed)."""
    module, function = scripts()[script].split(":")
    entry = getattr(importlib.import_module(module), function)

    def called() -> None:
        raise _Guarded

    monkeypatch.setattr(console_streams, "guard", called)
    monkeypatch.setattr("sys.argv", [script, "--help"])
    with pytest.raises(_Guarded):
        entry(["--help"]) if script != "ddp-run" else entry()
