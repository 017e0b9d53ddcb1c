"""A stop signal in ``ddp-run``'s first milliseconds, while the CLI's own modules are still being imported (issue 51,
polish): one console line and exit 128 + the signal, never a ``KeyboardInterrupt`` traceback, and a SIGINT to a
driver started in the background (SIGINT inherited ignored) is not lost.

A wall-clock delay after the start cannot aim at that window on a busy machine (and its first part is the
interpreter's own start-up, before any of the project's code). So the child, started as the ``ddp-run`` console
script starts, sends itself the signal the moment a given module of the CLI starts to import: Python runs the
handler at the next bytecode, inside that import, on any machine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The console script's own lines (pyproject.toml's ddp-run), after a finder that signals on the first import of
# ``target``.
CHILD = """
import importlib.abc, os, signal, sys
target, signum, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

class Trip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target_=None):
        if name == target:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signum)
        return None

sys.meta_path.insert(0, Trip())
sys.argv = [os.path.join(os.path.dirname(sys.executable), "ddp-run"), *args]
from ddp_runner.cli import main
sys.exit(main())
"""


def _ignore_sigint() -> None:  # as a non-interactive shell starts a background job
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(("module", "signum", "background"), [
    ("ddp_runner.contract.secrets", signal.SIGINT, False),
    ("ddp_runner.supervise.stop.guard", signal.SIGINT, True),
    ("ddp_runner.contract.errors", signal.SIGTERM, False),
])
def test_a_stop_while_the_cli_loads_is_one_line(module: str, signum: int, background: bool, tmp_path: Path) -> None:
    root = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", CHILD, module, str(int(signum)), "task=smoke", "device=cpu",
                        "world_size=1", "dry_run=true", f"output.root={root}"], cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=120, preexec_fn=_ignore_sigint if background else None)
    assert r.returncode == 128 + signum, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    name = signal.Signals(signum).name
    assert r.stderr.strip().splitlines() == [f"ddp-run: stopped by {name} before launching: nothing was started"]
    assert "plan" not in r.stdout and not root.exists(), r.stdout
