"""SIGTERM finishes the registered work first (tasks/engine/stop/signals.py), in a real child process: its main thread
blocked, as a rank's is inside a collective, and with a forked child that must not set it off."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from ddp_runner.tasks.engine.stop import signals as termination

PROGRAM = textwrap.dedent("""
    import os, sys, threading, time
    from ddp_runner.tasks.engine.stop import signals as termination

    out = sys.argv[1]
    termination.install(grace_s=float(sys.argv[2]))

    def finish(timeout_s, why):
        open(out + ".finishing", "a").close()  # at once: a watcher set off by mistake shows here
        time.sleep(min(1.0, timeout_s))  # the write in flight
        with open(out + ".finished", "a") as f:
            f.write(f"{why} {round(timeout_s)}\\n")

    termination.on_terminate(finish)
    if sys.argv[3] == "now":  # a rank that failed on its own finishes the work before SIGTERM comes
        termination.finish_now("error", grace_s=7)
    # A forked child says on a pipe when it has set itself up: the SIGTERM must find it so, not still running
    # what it inherited from this process.
    ready_r, ready_w = os.pipe()
    if sys.argv[3] == "child":  # a forked child (a DataLoader worker): SIGTERM ends it alone, as by default
        pid = os.fork()
        if pid == 0:
            termination.reset_in_child()
            os.write(ready_w, b"r")
            time.sleep(60)
            os._exit(0)
        os.read(ready_r, 1)
        os.kill(pid, 15)
        _, status = os.waitpid(pid, 0)
        open(out + ".child", "w").write(str(os.WIFSIGNALED(status) and os.WTERMSIG(status)))
    if sys.argv[3] == "loader":  # a DataLoader worker: the stop is the rank's to take, SIGTERM leaves it running
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            termination.shield_loader_worker()
            os.write(ready_w, b"r")
            os.read(go_r, 1)  # alive until after the SIGTERM, which comes first
            os._exit(7)
        os.read(ready_r, 1)
        os.kill(pid, 15)
        os.write(go_w, b"g")
        _, status = os.waitpid(pid, 0)
        open(out + ".child", "w").write(str(os.WIFEXITED(status) and os.WEXITSTATUS(status)))
    open(out + ".ready", "w").close()
    threading.Event().wait()  # blocked, like a rank inside a collective whose peer is gone
""")


def _start(tmp_path: Path, grace: float, mode: str) -> tuple[subprocess.Popen, str]:
    out = str(tmp_path / "w")
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, out, str(grace), mode], cwd=Path(__file__).parents[2])
    deadline = time.monotonic() + 30
    while not Path(out + ".ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the program did not start"
        time.sleep(0.05)
    return proc, out


def test_sigterm_finishes_the_work_then_dies_by_sigterm(tmp_path):
    proc, out = _start(tmp_path, grace=15, mode="plain")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM, "it still ends as SIGTERM's default action would"
    assert Path(out + ".finished").read_text() == "SIGTERM 15\n", "the work ran first, given the whole grace"


def test_a_forked_child_stopped_by_sigterm_does_not_stop_the_parent(tmp_path):
    proc, out = _start(tmp_path, grace=15, mode="child")
    assert Path(out + ".child").read_text() == str(int(signal.SIGTERM)), "the child died by SIGTERM"
    # Not a wait for a process to be ready: a quiet spell in which a watcher set off by mistake would have begun
    # the work (``.finishing`` is its first act). Load can only hide such a mistake here, never fail a good build.
    time.sleep(0.5)
    assert proc.poll() is None and not Path(out + ".finishing").exists(), "the parent's watcher stayed asleep"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM and Path(out + ".finished").exists()


def test_a_dataloader_worker_outlives_the_sigterm_its_rank_takes_as_a_stop(tmp_path):
    """torchrun signals a rank's whole process group: a loader worker must not die of it mid-save."""
    proc, out = _start(tmp_path, grace=15, mode="loader")
    assert Path(out + ".child").read_text() == "7", "the worker ran to its own end, untouched by SIGTERM"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM


def test_install_outside_the_main_thread_changes_nothing():
    before = signal.getsignal(signal.SIGTERM)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(termination.install()))
    t.start()
    t.join()
    assert result == [False] and signal.getsignal(signal.SIGTERM) == before


def test_work_finished_after_an_error_does_not_run_again_on_sigterm(tmp_path):
    proc, out = _start(tmp_path, grace=15, mode="now")
    assert Path(out + ".finished").read_text() == "error 7\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM
    assert Path(out + ".finished").read_text() == "error 7\n", "the work ran once"
