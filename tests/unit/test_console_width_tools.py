"""Every line the other tools print fits an 80-column console too (issue 51, item 9; runner/contract/textfit.py):
``ddp-compare`` (its prose; the report's tables stay whole, as report.md has them), ``ddp-doctor``, ``ddp-export``,
``ddp-tokenize``, ``ddp-runs show``, and a sweep, which says a refused job in one line (the whole refusal is in
sweep.json and sweep.md) and a pruned trial with its step. In process, over run directories written here; piped
output is left as it was (one record per line)."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from tests.support.driver import Terminal, cli_in_process

COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG = "a-rather-long-project-folder-name/with/some/depth/to/it"  # as a user's paths are


def _too_wide(text: str, width: int = COLUMNS, keep: tuple[str, ...] = ()) -> list[str]:
    """The lines of ``text`` wider than ``width``, less those that start with ``keep`` (a Markdown table's rows)
    and a path alone on its line (left whole, for a copy)."""
    return [line for line in ANSI.sub("", text).splitlines() if len(line) > width
            and not line.startswith(keep) and " " in line.strip()]


def _terminal(monkeypatch: pytest.MonkeyPatch) -> tuple[Terminal, Terminal]:
    """stdout and stderr as a terminal of ``COLUMNS`` columns whose size cannot be read (set in the test itself:
    pytest's capture takes sys.stdout back after a fixture's setup)."""
    out, err = Terminal(), Terminal()
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


# -- ddp-compare ---------------------------------------------------------------------------------------------------

def _compared_run(root: Path, name: str, task: str, world: int, lr: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16 * world,
            "device": "cpu"}
    (run / layout.MANIFEST).write_text(json.dumps({"status": layout.STATUS_COMPLETED, "task": task, "plan": plan}))
    (run / layout.CONFIG).write_text(f"train:\n  lr: {lr}\n  warmup_steps: {world * 10}\n")
    (run / layout.SUMMARY).write_text(json.dumps({
        "status": layout.STATUS_COMPLETED, "global_batch": 16 * world, "steps": 4, "losses": [4.0, 3.0, 2.0, 1.0],
        "median": {"step_time_s": 0.1 * world}}))


def test_ddp_compare_fits_its_prose_and_keeps_its_tables_whole(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    console = _terminal(monkeypatch)
    from ddp_runner.report import compare

    root = tmp_path / LONG
    for world in (1, 2, 4):  # global batches and settings that differ: warnings of a paragraph each
        _compared_run(root, f"00-08-1{world}_my_own_regression_task_w{world}", "my_own_regression_task", world,
                      0.001 * world)
    _compared_run(root, "00-09-00_smoke_w2", "smoke", 2, 0.01)
    out_dir = tmp_path / "report"
    assert compare.main([str(root), "--out", str(out_dir)]) == 0
    out, err = console[0].getvalue(), console[1].getvalue()
    assert "**Warning:**" in out and "Where the time goes" in out, out
    assert not _too_wide(out, keep=("|",)) and not _too_wide(err), _too_wide(out, keep=("|",)) + _too_wide(err)
    report = (out_dir / "report.md").read_text()
    assert [line for line in report.splitlines() if line.startswith("|")] == [
        line for line in out.splitlines() if line.startswith("|")]  # the tables as report.md has them
    # Piped: the report as report.md holds it, for a script.
    piped = io.StringIO()
    sys.stdout = piped
    assert compare.main([str(root), "--out", str(out_dir)]) == 0
    assert piped.getvalue().startswith(report), piped.getvalue()


# -- ddp-doctor ----------------------------------------------------------------------------------------------------

def test_ddp_doctor_fits_and_an_explanation_continues_under_its_column(
        monkeypatch: pytest.MonkeyPatch) -> None:
    console = _terminal(monkeypatch)
    from ddp_runner.diagnostics.doctor import cli

    report = {"status": "warn", "checks": [
        {"name": "visible devices", "status": "warn", "data": {},
         "summary": "CUDA_VISIBLE_DEVICES=3,1 reorders the GPUs: local rank 0 is physical GPU 3, so nvidia-smi's "
                    "numbers and the ranks' differ; the run directory records the mapping"},
        {"name": "environment", "status": "ok", "data": {"variables": {
            "NCCL_SOCKET_IFNAME": "eth0,ib0,enp65s0f0np0,enp65s0f1np1,docker0,br-0123456789ab,veth01234567"}},
         "summary": "no NCCL variable that slows training; NCCL_SOCKET_IFNAME names the interfaces to use"},
        {"name": "bandwidth", "status": "skipped", "data": {}, "summary": "--no-bandwidth"}]}
    monkeypatch.setattr(cli, "full_report", lambda **_: report)
    assert cli.main(["--no-bandwidth"]) == 0
    out = console[0].getvalue()
    assert not _too_wide(out), _too_wide(out)
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("visible devices"))
    column = lines[at].index("CUDA_VISIBLE")
    assert lines[at + 1].startswith(" " * column) and lines[at + 1][column] != " ", lines[at:at + 3]


# -- ddp-export ----------------------------------------------------------------------------------------------------

def test_ddp_export_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = _terminal(monkeypatch)
    import torch

    from ddp_runner.tasks import export as export_cli
    from ddp_runner.tasks.engine.checkpoint import storage

    ckpts = tmp_path / LONG / "00-08-17_my_own_regression_task_w2" / "checkpoints"
    state = {"model": {"w": torch.zeros(4)}, "progress": {"step": 2, "losses": [0.5]},
             "config": "task:\n  name: mytask\n  module: mytask\n", "plan": {"world_size": 1}}
    storage.save(str(ckpts), 2, state, keep_last=0)
    shutil.copytree(ckpts / "step_2", ckpts / "step_4")
    (ckpts / "step_4" / "meta.json").unlink()  # a save that never committed: refused, naming step_2
    with pytest.raises(SystemExit):
        export_cli.main([str(ckpts / "step_4"), "--out", str(tmp_path / LONG / "exported")])
    export_cli.main([str(ckpts.parent), "--out", str(tmp_path / LONG / "exported")])
    out, err = console[0].getvalue(), console[1].getvalue()
    assert "refused:" in err and "ddp-export: step 2 of" in out, (out, err)
    assert not _too_wide(out) and not _too_wide(err), _too_wide(out) + _too_wide(err)
    assert f"  {tmp_path / LONG / 'exported' / 'model.safetensors'}" in out.splitlines()  # a path stays whole


# -- ddp-tokenize --------------------------------------------------------------------------------------------------

def test_ddp_tokenize_fits_and_its_command_still_pastes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = _terminal(monkeypatch)
    from ddp_runner.data import tokenize

    text = tmp_path / LONG / "corpus"
    text.mkdir(parents=True)
    for i in range(10):
        (text / f"part{i}.txt").write_text(f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 40)
    (text / "latin1.txt").write_bytes(b"caf\xe9 au lait " * 20)  # a warning that names its files
    assert tokenize.main([str(text), "--out", str(tmp_path / LONG / "tokens"), "--vocab-size", "300",
                          "--quiet"]) == 0
    assert tokenize.main([str(text / "missing"), "--out", str(tmp_path / LONG / "none"), "--quiet"]) == 2
    out, err = console[0].getvalue(), console[1].getvalue()
    assert "warning:" in err and "error:" in err and "Fix: pass an existing" in err, err
    assert not _too_wide(out) and not _too_wide(err), _too_wide(out) + _too_wide(err)
    lines = out.splitlines()
    at = lines.index("Train on it:")
    assert lines[at + 1].startswith("  ddp-run task=gpt") and lines[at + 1].endswith(" \\"), lines


# -- ddp-runs show -------------------------------------------------------------------------------------------------

def test_ddp_runs_show_fits_and_its_commands_still_paste(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    console = _terminal(monkeypatch)
    from ddp_runner.report import runs

    run = tmp_path / LONG / "2026-12-05" / "00-08-17_my_own_regression_task_w2"
    (run / layout.PROGRESS).mkdir(parents=True)
    (run / layout.CONFIG).write_text("train:\n  max_steps: 2000\n")
    overrides = ["task.module=my_own_regression_task", "world_size=2", "batch.per_rank=64", "train.lr=0.001",
                 "train.max_steps=2000"]
    (run / layout.MANIFEST).write_text(json.dumps({
        "status": layout.STATUS_FAILED, "task": "my_own_regression_task", "ended": "2026-12-05T00:10:00",
        "plan": {"world_size": 2, "per_rank_batch": 64, "accumulation": 1, "global_batch": 128, "device": "cpu",
                 "backend": "gloo", "explanation": "global batch 128 = 64 per rank x 2 ranks x 1 micro-step"},
        "invocation": {"argv": ["ddp-run", *overrides], "overrides": overrides, "cwd": str(tmp_path / LONG)}}))
    (run / layout.SUMMARY).write_text(json.dumps({
        "status": layout.STATUS_FAILED, "root_cause": {
            "rank": 1, "kind": "exception", "type": "TypeError",
            "message": "Net.forward() takes 2 positional arguments but 3 were given",
            "where": f"{tmp_path / LONG}/badfwd.py:11 in Net.forward"}}))
    assert runs.main(["show", str(run)]) == 0
    out = console[0].getvalue()
    assert not _too_wide(out), _too_wide(out)
    lines = out.splitlines()
    assert str(run) in lines[1] and lines[0] == "run", lines  # the run's path whole, alone on its line
    at = next(i for i, line in enumerate(lines) if line.startswith("reproduce"))
    assert lines[at + 1].lstrip().startswith("cd ") and lines[at + 1].endswith(" \\"), lines


# -- a sweep -------------------------------------------------------------------------------------------------------

def test_a_refused_sweep_job_says_one_line_and_sweep_json_has_it_all(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ddp_runner.job import execute as execute_module
    from ddp_runner.job.invocation import Outcome

    def stand_in(conf: dict[str, Any], how: Any, check: Any = None) -> Outcome:  # the jobs that run
        return Outcome(0)

    monkeypatch.setattr(execute_module, "execute", stand_in)
    sweep = ["-m", "experiment=fixed_global_batch", "world_size=1,2,3", "task=smoke", "device=cpu"]
    r = cli_in_process(sweep, tmp_path / "out", monkeypatch, env={"COLUMNS": str(COLUMNS)}, tty=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Nothing was started" not in r.stderr and "  fix:" not in r.stderr, r.stderr  # no five lines a job
    assert "Fix: " in r.stderr and not _too_wide(r.stderr) and not _too_wide(r.stdout), r.stderr
    shutil.rmtree(tmp_path / "out")
    r = cli_in_process(sweep, tmp_path / "out", monkeypatch)  # piped: one line, whole
    said = [line for line in r.stderr.splitlines() if "job 2" in line or "batch.global" in line]
    assert len(said) == 1 and "(world_size=3) refused: batch.global=32: " in said[0] and "Fix: " in said[0], said
    [record] = list((tmp_path / "out").glob("*/*_sweep/sweep.json"))
    reason = json.loads(record.read_text())["jobs"][2]["reason"]
    assert reason.startswith("refused: batch.") and ". Fix: " in reason, reason
    assert reason in (record.parent / "sweep.md").read_text()


def test_a_refusal_outside_a_sweep_keeps_its_five_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_runner.job.invocation import refuse

    outcome = refuse(PlanError("batch.global", 100, "not divisible by 16", "set batch.global=96"))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ddp-run: refused: batch.global=100: not divisible by 16." and err[3] == "  fix:   set " \
        "batch.global=96" and len(err) == 5, err
    assert outcome.reason == "refused: batch.global=100: not divisible by 16. Fix: set batch.global=96"
    refuse(PlanError("batch.global", 100, "not divisible by 16", "set batch.global=96"), "job 2")
    assert capsys.readouterr().err == ("ddp-run: job 2 refused: batch.global=100: not divisible by 16. Fix: set "
                                       "batch.global=96\n")


def test_a_job_refused_at_its_turn_is_named_as_the_sweeps_job() -> None:
    from ddp_runner.job.invocation import Invocation, sweep_job

    assert sweep_job(Invocation(argv=["ddp-run"], sweep={"id": "00-09-00_sweep", "dir": "/o", "job": 3})) == "job 3"
    assert sweep_job(Invocation(argv=["ddp-run"], sweep={"id": "00-09-00_sweep", "dir": "/o", "job": 0})) == "job 0"
    assert sweep_job(Invocation(argv=["ddp-run"])) is None  # a run of its own: the five lines


def test_the_sweeps_closing_table_says_where_a_trial_was_pruned() -> None:
    from ddp_runner.report import sweep_table

    jobs = [{"job": 0, "values": {"train.lr": "0.1"}, "status": "completed", "objective": 1.2,
             "figures": {"steps": 40, "final_loss": 1.3, "val_loss": 1.2}},
            {"job": 1, "values": {"train.lr": "1.0"}, "status": "pruned", "pruned": {"step": 20, "value": 3.1},
             "figures": {"steps": 20, "final_loss": 3.0, "val_loss": 3.1}}]
    lines = sweep_table.table(jobs, ["train.lr"], {"key": "val_loss"}, COLUMNS)
    assert "pruned at step 20" in lines[2] and not _too_wide("\n".join(lines)), lines


# -- the fitter's parts these tools use ------------------------------------------------------------------------------

def test_a_reports_prose_wraps_and_its_tables_and_fenced_blocks_stay_whole() -> None:
    from ddp_runner.contract import textfit

    row = "| " + " | ".join(f"column {i}" for i in range(12)) + " |"
    code = "ddp-run task=gpt " + " ".join(f"train.key{i}=value{i}" for i in range(8))
    prose = "- " + " ".join(["a bottleneck sentence that names its run and says where the time goes"] * 2)
    text = "\n".join([prose, row, "```", code, "```", ""])
    lines = textfit.fit_prose(text, 40)
    assert row in lines and code in lines and lines[-1] == "", lines  # whole, and the report's last newline kept
    assert lines[0].startswith("- a bottleneck") and lines[1].startswith("  run ") and len(lines[0]) <= 40, lines
    assert not _too_wide("\n".join(x for x in lines if x not in (row, code)), 40), lines
    assert textfit.fit_prose(text, None) == text.split("\n")


def test_under_puts_continuations_under_a_tables_last_column_where_it_leaves_room() -> None:
    from ddp_runner.contract import textfit

    line = "visible devices  warn     " + "the explanation of a check, in words, that goes on for a while " * 2
    out = textfit.wrap(line, 70, under=26)
    assert len(out) > 1 and all(x.startswith(" " * 26) and x[26] != " " for x in out[1:]), out
    narrow = textfit.wrap(line, 55, under=26)  # 26 + NOTE_ROOM > 55: the usual hang, not a sliver of room
    assert len(narrow) > 1 and not narrow[1].startswith(" " * 26) and not _too_wide("\n".join(narrow), 55), narrow


def test_a_refusal_whose_fix_lists_choices_keeps_sweep_mds_table_whole() -> None:
    from ddp_runner.report import sweep

    job = {"job": 0, "values": {"device": "gpu"}, "status": "refused", "figures": {},
           "reason": "refused: device='gpu': not a device. Fix: device=auto|cpu|cuda"}
    lines = sweep.markdown([job], ["device"], ["ddp-run", "-m", "device=gpu"]).splitlines()
    head = next(line for line in lines if line.startswith("| job "))
    [row] = [line for line in lines if line.startswith("| 0 ")]
    cells = re.compile(r"(?<!\\)\|")  # a cell ends at a | that is not escaped
    assert len(cells.split(row)) == len(cells.split(head)) and "auto\\|cpu\\|cuda" in row, (head, row)
