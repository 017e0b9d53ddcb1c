"""Every line the tools print fits an 80-column console (issue 51, item 9; runner/console/textfit.py): lines wrapped at
word boundaries under a hanging indent, a command continued with a backslash so that it still pastes, ``ddp-runs``
narrowed by dropping columns before the run's name is ever cut. The width: a terminal's own (``COLUMNS``, else 80,
where its size cannot be read, as for :class:`Terminal` here); piped output is never changed. In process: the dry
run, a refusal, ``--help``, a failed run's closing account and ``ddp-runs`` over run directories written here."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.console import textfit
from ddp_runner.contract import layout
from ddp_runner.report import runs
from ddp_runner.rundir import listing
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise import finalize
from tests.support.driver import Terminal, cli_in_process
from tests.support.failed_runs import two_ranks_failed

COLUMNS = 80
NOW = time.time()


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _too_wide(text: str, width: int = COLUMNS) -> list[str]:
    return [line for line in ANSI.sub("", text).splitlines() if len(line) > width]


# -- the fitter ----------------------------------------------------------------------------------------------------

def test_the_width_is_the_terminals_and_piped_output_is_left_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl
    import pty
    import struct
    import termios

    monkeypatch.setenv("COLUMNS", "80")  # as a parent that loaded readline exports it
    assert textfit.terminal_width(io.StringIO()) is None  # piped: lines as they are, one record per line
    assert textfit.terminal_width(Terminal()) == 80  # a terminal whose size cannot be read
    monkeypatch.setenv("COLUMNS", "100")
    assert textfit.terminal_width(Terminal()) == 100 and textfit.terminal_width(io.StringIO()) is None
    monkeypatch.setenv("COLUMNS", "wide")
    assert textfit.terminal_width(Terminal()) == 80
    monkeypatch.delenv("COLUMNS")
    assert textfit.terminal_width(Terminal()) == 80
    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 70, 0, 0))
        monkeypatch.setenv("COLUMNS", "200")  # exported when the shell was wider: the terminal's own width wins
        with open(follower, "w", closefd=False) as tty:
            assert textfit.terminal_width(tty) == 70
    finally:
        os.close(leader)
        os.close(follower)


def test_lines_wrap_at_words_under_a_hanging_indent_and_paths_break_after_a_slash() -> None:
    path = "/scratch/me/outputs/2026-12-05/00-08-17_smoke_w2/" + "deep/" * 12 + "summary.json"
    line = f"ddp-run: completed: 8 steps, 2 ranks on distinct devices (cpu:0, cpu:1); details: {path}"
    out = textfit.wrap(line, 40)
    assert all(len(x) <= 40 for x in out), out
    assert out[0].startswith("ddp-run: completed:") and all(x.startswith("  ") for x in out[1:]), out
    assert "".join(x.strip() for x in out if "/" in x and "details" not in x).endswith("summary.json")
    assert all(x.endswith("/") for x in out if "/" in x and not x.endswith("summary.json")), out  # after a slash
    assert " ".join(x.strip() for x in out).replace("/ ", "/") == line
    # Two columns (a key and its text): the continuation goes under the text.
    key = "  train.lr             the learning rate of the optimizer, after its warm-up steps and more"
    out = textfit.wrap(key, 60)
    assert out[1].startswith(" " * 23) and not out[1].startswith(" " * 24), out
    assert textfit.wrap(line, None) == [line] and textfit.wrap("short", 40) == ["short"]


def test_a_command_is_continued_with_backslashes_and_runs_as_printed(tmp_path: Path) -> None:
    words = ["env", '"A=${RUN_DIR:?set RUN_DIR to a run directory ddp-run made, holding config.yaml and run.json}"',
             "B=2", "sh", "-c", "'echo \"$A\" \"$B\"'", "--padding=" + "x" * 20, "--more=" + "y" * 20]
    lines = textfit.command(words, 60)
    assert len(lines) > 2 and not _too_wide("\n".join(lines), 60), lines
    script = tmp_path / "cmd.sh"
    script.write_text("\n".join(lines) + "\n")
    ok = subprocess.run(["sh", str(script)], env={"RUN_DIR": "/runs/x", "PATH": "/usr/bin:/bin"},
                        capture_output=True, text=True)
    assert ok.stdout.split() == ["/runs/x", "2"], ok
    refused = subprocess.run(["sh", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "set RUN_DIR to a run directory ddp-run made, holding config.yaml and run.json" in refused.stderr
    assert textfit.command(words, None) == ["  " + " ".join(words)]


# -- ddp-run's own lines, at COLUMNS=80 ------------------------------------------------------------------------------

def test_a_dry_run_fits_and_its_command_still_pastes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A warmup longer than the run: a warning with it, as a run would print it.
    r = cli_in_process(["task=smoke", "device=cpu", "world_size=2", "train.max_steps=4", "train.warmup_steps=40",
                        "dry_run=true"], tmp_path / "outputs", monkeypatch, env={"COLUMNS": str(COLUMNS)}, tty=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ddp-run: warning: train.warmup_steps=40" in r.stderr, r.stderr
    assert not _too_wide(r.stdout) and not _too_wide(r.stderr), _too_wide(r.stdout + r.stderr)
    assert "ddp-run: dry run, nothing launched" in r.stdout and r.stdout.count(" \\\n") >= 3, r.stdout


def test_a_refusal_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli_in_process(["task=smoke", "device=cpu", "world_size=2", "batch.per_rank=8", "batch.global=100"],
                       tmp_path / "outputs", monkeypatch, env={"COLUMNS": str(COLUMNS)}, tty=True)
    assert r.returncode == layout.EXIT_REFUSED, r.stdout + r.stderr
    assert "ddp-run: refused: " in r.stderr and "  fix:" in r.stderr
    assert not _too_wide(r.stderr), _too_wide(r.stderr)


@pytest.mark.parametrize("args", [["--help"], ["--help", "train"]])
def test_help_fits(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli_in_process(args, tmp_path / "outputs", monkeypatch, env={"COLUMNS": str(COLUMNS)}, tty=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "train.lr" in r.stdout and not _too_wide(r.stdout), _too_wide(r.stdout)


MESSAGE = "Net.forward() takes 2 positional arguments but 3 were given"
TORCH = "/venv/lib/python3.11/site-packages/torch/nn"
TAIL = [f'  File "{TORCH}/parallel/distributed.py", line 1715, in _run_ddp_forward',
        "    return self.module(*inputs, **kwargs)  # type: ignore[index]",
        f'  File "{TORCH}/modules/module.py", line 1789, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        f"TypeError: {MESSAGE}"]
WHERE = "/home/me/projects/my-own-task/badfwd.py:11 in Net.forward (the engine calls model(x, y))"


def test_a_failed_runs_closing_account_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    monkeypatch.setattr("sys.stderr", Terminal())
    run = tmp_path / "outputs" / "2026-12-05" / "00-08-17_my_own_regression_task_w2"
    rd, plan = two_ranks_failed(run, MESSAGE, TAIL, WHERE)
    assert finalize.finish(rd, {"versions": {}}, plan, rc=1, interrupted=None) == 1
    err = sys.stderr.getvalue()
    assert not _too_wide(err), _too_wide(err)
    lines = err.strip().splitlines()
    # The cause first (issue 51 item 10), said once, with the user's line right after it.
    assert lines[0].startswith("ddp-run: FAILED: earliest error on rank 1 [exception]: TypeError:"), lines
    assert err.count("earliest error on rank 1") == 1 and "Net.forward" in err
    assert any(line.lstrip().startswith("where:") for line in lines[:4]), lines


# -- ddp-runs ------------------------------------------------------------------------------------------------------

def _run(parent: Path, name: str, world: int = 2, task: str = "gpt2_small") -> Path:
    run = parent / name
    (run / layout.PROGRESS).mkdir(parents=True)
    started = datetime.fromtimestamp(NOW - 300).isoformat(timespec="seconds")
    (run / layout.MANIFEST).write_text(json.dumps({
        "status": "completed", "task": task, "started": started,
        "plan": {"world_size": world, "per_rank_batch": 8, "accumulation": 1, "global_batch": 8 * world}}))
    (run / layout.CONFIG).write_text("train:\n  max_steps: 2000\n")
    (run / layout.SUMMARY).write_text(json.dumps({
        "status": "completed", "global_batch": 8 * world, "steps": 2000, "losses": [3.2, 2.1234],
        "median": {"step_time_s": 0.05, "tokens_per_s": 123456.0}}))
    return run


def _tree(root: Path) -> list[str]:
    """Runs whose names differ only at their end, and a sweep whose jobs do (names as ddp-runs shows them)."""
    day = root / "2026-12-05"
    names = [_run(day, f"00-08-1{i}_gpt2_small_w{w}").name for i, w in enumerate((1, 2, 4))]
    sweep = day / "00-09-00_sweep"
    names += [_run(sweep, f"{j}_gpt2_small_w1_train.lr={lr}", world=1).name for j, lr in enumerate(("1e-3", "3e-4"))]
    (sweep / layout.SWEEP_JOB_LOGS).mkdir()
    (sweep / layout.SWEEP_JOB_LOGS / "job-0.log").write_text("a job's console\n")
    return names


@pytest.mark.parametrize("width", [80, 100, 120])
def test_ddp_runs_keeps_every_runs_name_whole_in_a_narrow_console(width: int, tmp_path: Path) -> None:
    names = _tree(tmp_path)
    rows = listing.scan(str(tmp_path), NOW).rows
    text = runs.plain(rows, NOW, width)
    assert not _too_wide(text, width), text
    assert all(name in text for name in names), text
    assert text.splitlines()[0].split()[:2] == ["RUN", "STATUS"]
    assert runs.plain(rows, NOW).splitlines()[0].split() == [w for h in runs.HEAD for w in h.split()]  # piped: whole
    buf = io.StringIO()
    runs.rich_table(rows, NOW, buf, width=width)
    drawn = buf.getvalue()
    assert all(name in drawn for name in names), drawn
    # rich folds a column it cannot fit: the columns went before the run's name did
    assert "STATUS" in drawn and ("TASK" not in drawn if width < 120 else True), drawn


def test_ddp_runs_at_80_columns_and_no_word_about_a_sweeps_own_jobs_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = _tree(tmp_path)
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    monkeypatch.setattr("sys.stdout", Terminal())
    monkeypatch.setattr("sys.stderr", Terminal())
    assert runs.main([str(tmp_path)]) == 0
    out, err = sys.stdout.getvalue(), sys.stderr.getvalue()
    assert "\x1b[" in out and all(name in ANSI.sub("", out) for name in names) and not _too_wide(out), out
    assert err == "", err  # the sweep's jobs/ folder (its jobs' consoles) is its own, not a damaged run
    found = listing.scan(str(tmp_path), NOW)
    assert found.skipped == [] and [len(r.jobs) for r in found.rows if r.kind == "sweep"] == [2]


# -- a sweep run in turn: one line per finished job ------------------------------------------------------------------

def test_which_sweep_jobs_say_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddp_runner.console import sweep_view

    monkeypatch.delenv(layout.ENV_SWEEP_CONSOLE, raising=False)
    job = {"id": "00-09-00_sweep", "dir": "/runs/00-09-00_sweep", "job": 1}
    assert sweep_view.in_turn(job, {"launcher": {"name": "local"}})
    assert not sweep_view.in_turn(None, {"launcher": {"name": "local"}})  # a run of its own
    assert not sweep_view.in_turn(job, {"launcher": {"name": "local"}, "dry_run": True})  # every job's plan
    assert not sweep_view.in_turn(job, {"launcher": {"name": "slurm"}})
    monkeypatch.setenv(layout.ENV_SWEEP_CONSOLE, "/tmp/job-1.jsonl")  # a concurrent sweep's job: the view
    assert not sweep_view.in_turn(job, {"launcher": {"name": "local"}})


def test_a_job_run_in_turn_keeps_its_rank_0_console_in_its_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddp_runner.supervise import session

    monkeypatch.delenv(layout.ENV_SWEEP_CONSOLE, raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # piped: no bar, but no step lines on the console either
    rd = RunDir(url=str(tmp_path), local=str(tmp_path), fs=LocalFileSystem(), path=str(tmp_path))
    plan = Plan(world_size=2, per_rank_batch=8, accumulation=1, global_batch=16, device="cpu", backend="gloo",
                nnodes=1, nproc_per_node=2)
    env: dict[str, str] = {}
    assert session.live_bar(rd, {"task": {"name": "smoke"}}, plan, env, in_turn=True) is None
    assert env[layout.ENV_CONSOLE_RECORDS] == str(tmp_path / layout.CONSOLE_RECORDS)
    env = {}
    assert session.live_bar(rd, {"task": {"name": "smoke"}}, plan, env) is None and env == {}  # a run: plain lines


def test_a_failed_job_run_in_turn_says_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(layout.ENV_SWEEP_CONSOLE, raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    run = tmp_path / "00-09-00_sweep" / "2_smoke_w2_seed=3"
    rd, plan = two_ranks_failed(run, MESSAGE, TAIL, WHERE)
    manifest = {"versions": {}, "invocation": {"sweep": {"id": "00-09-00_sweep", "job": 2}}}
    assert finalize.finish(rd, manifest, plan, rc=1, interrupted=None) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"ddp-run: job 2 FAILED: earliest error on rank 1 [exception]: TypeError: {MESSAGE}; details:"
        f" {run}/summary.json"], err
    assert json.loads((run / layout.SUMMARY).read_text())["root_cause"]["where"] == WHERE  # the rest is there


def test_lines_printed_above_the_bar_fit_the_terminal(tmp_path: Path) -> None:
    from rich.console import Console

    from ddp_runner.console import live

    buf = io.StringIO()
    bar = live.Live(str(tmp_path / "console.jsonl"), "smoke · 2 ranks", console=Console(file=buf, width=COLUMNS))
    text = ("warning: rank 0 passed over checkpoint step_40 in /scratch/me/outputs/2026-12-05/00-08-17_smoke_w2:"
            " its meta.json is not JSON; the run continues from step_30")
    bar.say(text)
    printed = buf.getvalue()
    assert len(printed.splitlines()) > 1 and not _too_wide(printed), printed
    assert " ".join(line.strip() for line in printed.splitlines()).replace("/ ", "/") == text


def test_a_command_on_a_line_of_its_own_still_runs_as_printed(tmp_path: Path) -> None:
    path = "/home/someone/projects/thing/outputs/2026-12-05/00-08-36_sweep/0_smoke_w1_seed=1"
    lines = textfit.fit_lines(f"ddp-run: interrupted: the last complete checkpoint is step_8. Continue it with:\n"
                              f"  ddp-run resume={path} train.max_steps=40", 60)
    assert not _too_wide("\n".join(lines), 60), lines
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("ddp-run "))
    script, stand_in = tmp_path / "cmd.sh", tmp_path / "bin" / "ddp-run"  # it prints its arguments
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    stand_in.chmod(0o755)
    script.write_text("\n".join(lines[at:]) + "\n")
    ran = subprocess.run(["sh", str(script)], capture_output=True, text=True,
                         env={"PATH": f"{stand_in.parent}:/usr/bin:/bin"})
    assert ran.stdout.split() == [f"resume={path}", "train.max_steps=40"], (lines, ran)
    # A comment would end at the line's end and run what follows: such a line is left whole.
    commented = f"  ddp-run resume={path}    # in place, from step_8"
    assert textfit.wrap(commented, 60) == [commented]
