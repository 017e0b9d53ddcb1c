"""Issue 51 item 4: every ddp-run command the tools print runs as printed, and is printed only where it is accepted.
Each printed shape is taken from the tool's own output, split as a shell splits it, and run through ddp-run's main()
in this process as a dry run: accepted (exit 0), never refused by Hydra's parser or by the resume checks. The run
directory is a copy of a real run in a folder named as a sweep's job is (``0_smoke_w2_seed=1``), with a non-ASCII
letter: both need quoting for Hydra."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddp_runner.contract import layout
from ddp_runner.report import runs
from ddp_runner.supervise import finalize
from ddp_runner.supervise.stop import outcome
from tests.support.driver import cli_in_process
from tests.support.run_tree import load_json

NAME = "0_smoke_w2_seed=1_é"


@pytest.fixture
def run(tmp_path: Path, smoke_reference: Path) -> Path:
    """A copy of the shared completed smoke run (8 steps, checkpoints every 2) named like a sweep's job."""
    dest = tmp_path / "sweep" / NAME
    shutil.copytree(smoke_reference, dest)
    return dest


def _set(run: Path, **fields: object) -> None:
    manifest = load_json(run / layout.MANIFEST)
    (run / layout.MANIFEST).write_text(json.dumps({**manifest, **fields}))


def accepted(command: str, monkeypatch: pytest.MonkeyPatch, root: Path) -> str:
    """Run the printed ``command`` (``[cd DIR &&] ddp-run …``) as a dry run; its stdout. Fails when refused."""
    words = shlex.split(command)
    cwd = None
    if words[0] == "cd":
        cwd, words = words[1], words[3:]
    assert words[0] == "ddp-run", command
    r = cli_in_process([*words[1:], "dry_run=true"], root, monkeypatch, cwd=cwd)
    assert r.returncode == 0, f"{command}\n{r.stdout}{r.stderr}"
    assert "dry run, nothing launched" in r.stdout, r.stdout
    return r.stdout


def shown(run: Path, key: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The value of ``key`` in ``ddp-runs show``'s output, its trailing comment left off."""
    assert runs.main(["show", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [line] = [ln for ln in lines if ln.startswith(f"{key} ")]
    return line[len(key):].strip().split("    #")[0]


def test_show_continue_runs_as_printed(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _set(run, status=layout.STATUS_INTERRUPTED)
    command = shown(run, "continue", capsys)
    assert accepted(command, monkeypatch, tmp_path / "unused")
    assert shlex.split(command) == ["ddp-run", f'resume="{run}"']


def test_the_console_continue_lines_run_as_printed(run: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _set(run, status=layout.STATUS_INTERRUPTED)
    stopped = {"checkpoint": "step_8", "step": 8}
    printed = [*outcome.continue_lines(str(run), "interrupted", stopped),
               *finalize.resume_lines(SimpleNamespace(url=str(run)), None, "failed")]  # type: ignore[arg-type]
    commands = [line.strip() for line in printed if line.strip().startswith("ddp-run ")]
    assert len(commands) == 2, printed
    for command in commands:
        accepted(command, monkeypatch, tmp_path / "unused")


def test_the_refusal_of_a_completed_run_names_a_command_that_runs(run: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli_in_process([f'resume="{run}"'], tmp_path / "unused", monkeypatch)
    assert r.returncode == 2 and "completed all its 8 steps" in r.stderr, r.stderr
    fix = r.stderr.split("fix:", 1)[1].split("raise train.max_steps: ", 1)[1].split(" (continues", 1)[0]
    assert "train.max_steps=16" in accepted(fix, monkeypatch, tmp_path / "unused")


def test_reproduce_of_a_completed_continued_run_is_the_command_that_started_it(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first = load_json(run / layout.MANIFEST)["invocation"]
    resumed = {**first, "argv": ["ddp-run", f'resume="{run}"', "train.max_steps=10"],
               "overrides": [f'resume="{run}"', "train.max_steps=10"]}
    _set(run, invocation=resumed, first_invocation=first, continued=["2026-01-01T12:00:00"])
    command = shown(run, "reproduce", capsys)
    assert "resume=" not in command and "world_size=2" in command, command
    accepted(command, monkeypatch, tmp_path / "unused")
    _set(run, first_invocation=None)  # a record that lost it: no command rather than one that is refused
    assert shown(run, "reproduce", capsys).startswith("— (run.json records only the command that continued it")


def test_a_run_without_a_checkpoint_prints_no_continue_and_its_refusal_a_restart_that_runs(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(run / layout.CHECKPOINTS)
    _set(run, status=layout.STATUS_FAILED)
    assert "resume=" not in shown(run, "continue", capsys)
    accepted(shown(run, "reproduce", capsys), monkeypatch, tmp_path / "unused")
    r = cli_in_process([f"resume='{run}'"], tmp_path / "unused", monkeypatch)
    assert r.returncode == 2 and "holds no complete checkpoint" in r.stderr, r.stderr
    fix = r.stderr.split("in a new run directory: ", 1)[1].strip().splitlines()[0]
    assert fix.endswith("resume=restart"), fix
    assert fix.startswith("cd ") and f"resume={run}" not in fix and f'resume="{run}"' not in fix, fix
    accepted(fix, monkeypatch, tmp_path / "unused")


def test_slurms_requeue_fallback_runs_as_printed(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    from ddp_runner.launch import slurm

    _set(run, status=layout.STATUS_INTERRUPTED)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "denied"))
    slurm.requeue("42", str(run))
    command = capsys.readouterr().err.split("continue with: ", 1)[1].strip()
    accepted(command, monkeypatch, tmp_path / "unused")


def test_ddp_tokenizes_train_line_reads_back_its_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ddp_runner.data.tokenize import cli as tokenize_cli

    out = tmp_path / "my book=1 é"
    tokenize_cli._say_done(str(out), 100, 10, 300)
    line = capsys.readouterr().out.split("Train on it: ", 1)[1].strip()
    words = shlex.split(line)
    assert words[:2] == ["ddp-run", "task=gpt"], words
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(words[1:])}
    assert parsed["data.path"] == f"{out}/train.bin" and parsed["data.val_path"] == f"{out}/val.bin", parsed


def test_show_continues_a_run_without_its_own_checkpoint_from_the_one_it_started_from(
        run: Path, tmp_path: Path, smoke_reference: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    source = f"{smoke_reference}/checkpoints/step_8"
    shutil.rmtree(run / layout.CHECKPOINTS)
    config = (run / layout.CONFIG).read_text()
    assert "\nresume: auto\n" in config
    (run / layout.CONFIG).write_text(config.replace("\nresume: auto\n", f"\nresume: {source}\n"))
    _set(run, status=layout.STATUS_FAILED)
    command = shown(run, "continue", capsys)
    assert shlex.split(command)[0] == "ddp-run", command
    accepted(command, monkeypatch, tmp_path / "unused")
