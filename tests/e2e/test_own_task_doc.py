"""docs/own-task.md replayed as written, from an empty folder holding only the files the page shows: its main
command launched for real through the CLI (the run's name, the extra metric in summary.json, TensorBoard and the
ddp-compare table, the trained weights loaded back with plain torch), every other command at least composed and
planned (dry run). A command the page shows that this test does not know how to check fails the test."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.doc_commands import shown_files
from tests.support.run_tree import load_json, run_dirs

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "own-task.md"
MAIN = "ddp-run --config-dir conf task=mytask device=cpu world_size=2"
TOOLS = {"ddp-run": ["-P", "-m", "ddp_runner"], "ddp-compare": ["-P", "-m", "ddp_runner.report.compare"], "python": []}
NOT_RUN = ("tensorboard",)  # a server: the scalars it would show are read from the event files below


def doc_commands(text: str) -> list[str]:
    """Every command line of the page's ``bash`` blocks, without its comment."""
    lines = [line.split("  #")[0].strip() for block in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)
             for line in block.splitlines()]
    return [line for line in lines if line]


def _run(work: Path, cmd: str, extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(cmd)
    assert argv[0] in TOOLS, f"the page shows a command this test does not check: {cmd}"
    return subprocess.run([sys.executable, *TOOLS[argv[0]], *argv[1:], *(extra or [])], cwd=work,
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_the_own_task_page_runs_as_written(tmp_path: Path) -> None:
    text = DOC.read_text()
    work = tmp_path / "work"
    for name, body in shown_files(DOC).items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(body)
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == [
        "conf/task/mytask.yaml", "load_weights.py", "mytask.py"]
    commands = doc_commands(text)
    assert MAIN in commands

    r = _run(work, MAIN)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [run] = run_dirs(work / "outputs")
    assert run.name.endswith("_mytask_w2")
    assert load_json(run / "run.json")["task"] == "mytask"
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 48
    metrics = summary["metrics"]
    assert set(metrics) == {"train/accuracy", "val/accuracy"} and metrics["val/accuracy"] > 0.9, metrics
    assert summary["final"]["train/accuracy"] == metrics["train/accuracy"]
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/accuracy")] == list(range(1, 49))
    assert [e.step for e in acc.Scalars("val/accuracy")] == [16, 32, 48]
    assert acc.Scalars("val/accuracy")[-1].value == pytest.approx(metrics["val/accuracy"])
    assert re.search(r"step 16 val/loss \d\.\d+ val/accuracy [01](\.\d+)?\n", (run / "logs" / "rank0.log").read_text())

    for cmd in commands:
        if cmd == MAIN or cmd.startswith(NOT_RUN):
            continue
        if cmd.startswith("ddp-run"):  # composed and planned, nothing launched
            r = _run(work, cmd, ["dry_run=true"])
            assert r.returncode == 0, f"{cmd}\n{r.stderr}"
            assert r.stdout.startswith("ddp-run: mytask: global batch"), f"{cmd}\n{r.stdout}"
        elif cmd.startswith("ddp-compare"):
            r = _run(work, cmd)
            assert r.returncode == 0, r.stderr
            report = (work / "compare" / "report.md").read_text()
            assert "| val loss | val/accuracy | train/accuracy |" in report, report
            [header, row] = (work / "compare" / "report.csv").read_text().splitlines()
            assert dict(zip(header.split(","), row.split(","), strict=True))["val/accuracy"] == str(
                metrics["val/accuracy"])
        else:  # python load_weights.py: the trained weights, loaded into the user's own class
            r = _run(work, cmd)
            assert r.returncode == 0, r.stderr
            found = re.search(r"step_48: loss (\S+), accuracy (\S+)", r.stdout)
            assert found and float(found[2]) > 0.9, r.stdout
    assert run_dirs(work / "outputs") == [run], "the dry runs made no run directory"


def test_the_readme_own_task_commands_are_the_pages():
    """The README's own-task section links the page and shows only commands the page's test runs."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own task", 1)[-1].split("\n## ", 1)[0]
    assert "docs/own-task.md" in section
    shown = [line.split("  #")[0].strip() for line in section.splitlines() if line.strip().startswith("ddp-run")]
    assert shown and set(shown) <= set(doc_commands(DOC.read_text())), shown

