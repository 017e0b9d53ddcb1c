"""docs/own-task.md replayed as written, in the page's order, from an empty folder holding only the files the page
shows: every ``ddp-run`` command launched for real through the CLI, as a user following the page would (so a later
step meets the runs the earlier ones made: the newest run is the page's last launch, not its main one), then the
run's name, the extra metric in summary.json, TensorBoard and the ddp-compare table checked, and the trained weights
loaded back with plain torch. A command the page shows that this test does not know how to check fails the test."""

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


def _check_main_run(run: Path) -> dict:
    """The page's main run: its name, the extra metric in summary.json, TensorBoard and the rank's log."""
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
    return metrics


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

    made: dict[str, Path] = {}  # each launch's run directory
    checked = set()
    for cmd in commands:  # in the page's order: a step meets what the steps before it left
        if cmd.startswith(NOT_RUN):
            continue
        before = set(run_dirs(work / "outputs")) if (work / "outputs").exists() else set()
        r = _run(work, cmd)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        if cmd.startswith("ddp-run"):
            [made[cmd]] = set(run_dirs(work / "outputs")) - before
            if cmd == MAIN:
                metrics = _check_main_run(made[cmd])
        elif cmd.startswith("ddp-compare"):
            report = (work / "compare" / "report.md").read_text()
            assert "| val loss | val/accuracy | train/accuracy |" in report, report
            [header, *rows] = (work / "compare" / "report.csv").read_text().splitlines()
            table = {row.split(",")[0]: dict(zip(header.split(","), row.split(","), strict=True)) for row in rows}
            assert set(table) == {run.name for run in made.values()}, table
            assert table[made[MAIN].name]["val/accuracy"] == str(metrics["val/accuracy"])
        else:  # python load_weights.py: the newest run's trained weights, loaded into the user's own class
            newest = max(made.values())
            found = re.search(r"step_(\d+): loss (\S+), accuracy (\S+)", r.stdout)
            assert found and float(found[3]) > 0.9, r.stdout
            assert found[0].startswith(f"step_{load_json(newest / 'summary.json')['steps']}:"), (newest, r.stdout)
            assert str(newest.relative_to(work)) in r.stdout, (newest, r.stdout)
        checked.add(cmd.split()[0])
    assert checked == {"ddp-run", "ddp-compare", "python"}, checked


def test_the_readme_own_task_commands_are_the_pages():
    """The README's own-task section links the page and shows only commands the page's test runs."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own task", 1)[-1].split("\n## ", 1)[0]
    assert "docs/own-task.md" in section
    shown = [line.split("  #")[0].strip() for line in section.splitlines() if line.strip().startswith("ddp-run")]
    assert shown and set(shown) <= set(doc_commands(DOC.read_text())), shown

