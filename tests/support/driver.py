"""The driver as a test runs it: typed as a user types it (a new interpreter) or its ``main()`` in this process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def ddp_run(args: list[str], root: Path | str, timeout: float = 240, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``python -m ddp_runner <args> output.root=<root>`` as a user would type it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], cwd=tempfile.gettempdir(),
                          env=full_env, capture_output=True, text=True, timeout=timeout)


class Terminal(io.StringIO):
    """Captured output that says it is a terminal whose size cannot be read: ddp-run fits its lines to ``COLUMNS``
    (runner/console/textfit.py), as it would on a terminal that wide."""

    def isatty(self) -> bool:
        return True


def cli_in_process(args: list[str], root: Path | str, monkeypatch: pytest.MonkeyPatch,
                   env: dict[str, str] | None = None, cwd: Path | str | None = None, tty: bool = False,
                   ) -> subprocess.CompletedProcess[str]:
    """``ddp-run <args> output.root=<root>`` through ``ddp_runner.cli.main()`` in this process: for refusals and dry
    runs, which end before anything is launched (a fraction of a second instead of a new interpreter). The exit
    code is main()'s ``SystemExit``; stdout and stderr are what it printed (``tty``: to a :class:`Terminal`). Any
    other exception propagates (a traceback is a failure, as it would be on a user's console). ``cwd``: where it
    runs (default: the temp dir)."""
    from ddp_runner import cli

    monkeypatch.setattr(cli, "_run", cli._Invocation())  # what one ddp-run process carries across its jobs
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["ddp-run", *args, f"output.root={root}"])
    monkeypatch.chdir(cwd or tempfile.gettempdir())
    out, err = (Terminal(), Terminal()) if tty else (io.StringIO(), io.StringIO())
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(sys.argv, code if isinstance(code, int) else 1, out.getvalue(),
                                       err.getvalue())
