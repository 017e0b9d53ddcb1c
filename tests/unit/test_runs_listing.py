"""ddp-runs (runner/rundir/listing.py, runner/report/runs.py) on run trees written here as the runner writes them:
the figures a row takes from summary.json, TensorBoard and the progress record; truthful statuses (``lost`` for a
``running`` run whose driver is gone, ``running`` only while it lives); sweeps with their jobs, a refused job
included; damaged and foreign directories skipped with a note; the commands ``show`` prints."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from ddp_runner.contract import checkpoints, layout
from ddp_runner.report import runs
from ddp_runner.rundir import listing
from ddp_runner.rundir.status import this_driver

NOW = time.time()


def _manifest(status: str, world: int = 2, task: str = "smoke", started: float = NOW - 120,
              driver: dict | None = None) -> dict:
    return {"status": status, "task": task, "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "plan": {"world_size": world, "per_rank_batch": 8, "accumulation": 1, "global_batch": 8 * world,
                     "device": "cpu", "backend": "gloo", "nnodes": 1,
                     "explanation": f"global batch {8 * world} = 8 per rank × {world} ranks × 1 accumulation"},
            "driver": driver or {"host": "gone-host", "pid": 1, "started": 0.0, "heartbeat": started},
            "invocation": {"argv": ["ddp-run", "-m", "--config-dir", "/my conf", "task=smoke", "world_size=1,2"],
                           "cwd": "/home/me/proj", "overrides": ["task=smoke", f"world_size={world}"]}}


def _run(parent: Path, name: str, manifest: dict, summary: dict | None = None, step: int | None = None,
         max_steps: int | None = 8) -> Path:
    run = parent / name
    (run / layout.PROGRESS).mkdir(parents=True)
    (run / layout.MANIFEST).write_text(json.dumps(manifest))
    (run / layout.CONFIG).write_text(f"train:\n  max_steps: {'null' if max_steps is None else max_steps}\n")
    if summary is not None:
        (run / layout.SUMMARY).write_text(json.dumps(summary))
    if step is not None:
        (run / layout.rank_progress(0)).write_text(json.dumps({"rank": 0, "step": step, "phase": "train"}))
    return run


COMPLETED = {"status": "completed", "global_batch": 16, "steps": 8, "losses": [2.0, 1.5, 0.75],
             "median": {"step_time_s": 0.01, "tokens_per_s": None}}


# --- pure parts -------------------------------------------------------------------------------------------------

def test_figures_from_a_summary_and_from_tensorboard_scalars() -> None:
    assert listing.final_figures(COMPLETED) == {"step": 8, "last_loss": 0.75, "throughput": pytest.approx(1600.0),
                                                "unit": "samples/s"}
    gpt = {"steps": 4, "losses": [5.0], "global_batch": 8, "median": {"step_time_s": 0.5, "tokens_per_s": 4096.0}}
    assert listing.final_figures(gpt)["unit"] == "tokens/s" and listing.final_figures(gpt)["throughput"] == 4096.0
    assert listing.final_figures({"status": "failed", "losses": None}) == {}
    live = listing.live_figures({"train/loss": (3, 1.25), "perf/samples_per_s": (3, 900.0), "lr": (3, 0.1)})
    assert live == {"step": 3, "last_loss": 1.25, "throughput": 900.0, "unit": "samples/s"}


def test_tensorboard_scalars_are_read_up_to_a_record_cut_short(tmp_path: Path) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(tmp_path))
    for step, loss in ((1, 2.0), (2, 1.5), (3, 1.0)):
        value = summary_pb2.Summary.Value(tag="train/loss", simple_value=loss)
        w.add_event(event_pb2.Event(step=step, wall_time=NOW, summary=summary_pb2.Summary(value=[value])))
    w.close()
    [path] = tmp_path.glob("events.out.tfevents.*")
    data = path.read_bytes()
    assert listing.tb_scalars(data) == {"train/loss": (3, 1.0)}
    assert listing.tb_scalars(data[:-5]) == {"train/loss": (2, 1.5)}  # the writer was killed mid-record


def test_sweep_status_and_cells() -> None:
    done, failed = listing.Row("a", "a", "run", "completed"), listing.Row("b", "b", "run", "failed")
    live, refused = listing.Row("c", "c", "run", "running"), listing.Row("d", "", "job", "refused")
    assert listing.sweep_status([done, done], recorded=True) == "completed"
    assert listing.sweep_status([done, refused], recorded=True) == "partial"
    pruned = listing.Row("f", "f", "run", "pruned")
    assert listing.sweep_status([done, pruned], recorded=True) == "completed"  # a search's pruned trial
    assert listing.sweep_status([pruned], recorded=True) == "partial"  # no trial ran to its end
    assert listing.sweep_status([done, live], recorded=False) == "running"
    assert listing.sweep_status([done, failed], recorded=False) == "lost"  # its driver ended before the sweep did
    assert listing.sweep_status([done, listing.Row("e", "e", "run", "preempted")], recorded=False) == "preempted"
    assert listing.job_counts([done, done, refused]) == "3 jobs: 2 completed, 1 refused"
    assert [runs.age(NOW - s, NOW) for s in (5, 600, 7200, 3 * 86400)] == ["5 s", "10 min", "2 h", "3 d"]
    assert runs.age(None, NOW) == "—"
    assert [runs.rate(v, "samples/s") for v in (12.345, 1624.06, 63606.0)] == [
        "12.3 samples/s", "1,624 samples/s", "63.6k samples/s"]


def test_the_reproduce_command_keeps_options_and_this_jobs_overrides() -> None:
    inv = _manifest("completed")["invocation"]
    assert runs.reproduce_command(inv) == ("cd /home/me/proj && ddp-run --config-dir '/my conf' task=smoke"
                                           " world_size=2")
    assert runs.reproduce_command({}) is None


def test_the_reproduce_command_is_the_form_the_user_gave() -> None:
    """``task.module=x`` alone composes the custom preset (ddp-run adds ``task=custom``): the command shown is the
    user's, which adds it again; a ``task=custom`` the user typed stays."""
    inv = {"argv": ["ddp-run", "task.module=mytask", "device=cpu"], "cwd": "/home/me/proj",
           "overrides": ["task.module=mytask", "device=cpu", "task=custom"]}
    assert runs.reproduce_command(inv) == "cd /home/me/proj && ddp-run task.module=mytask device=cpu"
    typed = {**inv, "argv": ["ddp-run", "task=custom", "task.module=mytask", "device=cpu"],
             "overrides": ["task=custom", "task.module=mytask", "device=cpu"]}
    assert runs.reproduce_command(typed).endswith("ddp-run task=custom task.module=mytask device=cpu")


# --- a tree ---------------------------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    day = root / "2026-12-01"
    _run(day, "10-00-00_smoke_w2", _manifest("completed", started=NOW - 3 * 3600), COMPLETED)
    _run(day, "11-00-00_smoke_w2", _manifest("failed", started=NOW - 2 * 3600),
         {"status": "failed", "root_cause": {"rank": 1, "class": "exception", "type": "RuntimeError",
                                             "message": "boom", "where": "mytask.py:12 in forward"}}, step=3)
    _run(day, "12-00-00_smoke_w2", _manifest("interrupted", started=NOW - 3600), {"status": "interrupted"}, step=5)
    _run(day, "13-00-00_smoke_w2", _manifest("running", started=NOW - 1800), step=6)  # its driver is gone: lost
    _run(day, "14-00-00_smoke_w1", _manifest("running", world=1, started=NOW - 60, driver=this_driver()), step=2,
         max_steps=None)  # this process: alive
    sweep = day / "09-00-00_sweep"
    _run(sweep, "0_smoke_w1", _manifest("completed", world=1, started=NOW - 4 * 3600), COMPLETED)
    (sweep / "sweep.json").write_text(json.dumps({"jobs": [
        {"job": 0, "status": "completed", "run_dir": str(sweep / "0_smoke_w1")},
        {"job": 1, "status": "refused", "reason": "refused: batch.global=24: not divisible"}]}))
    _run(root, "abc123_smoke_w4", _manifest("completed", world=4, started=NOW - 30), COMPLETED)  # multi-node
    (day / "15-00-00_smoke_w2").mkdir()  # created, never written
    broken = day / "16-00-00_smoke_w2"
    broken.mkdir()
    (broken / layout.MANIFEST).write_text("{not json")
    foreign = day / "17-00-00_other"
    foreign.mkdir()
    (foreign / layout.MANIFEST).write_text(json.dumps({"name": "someone else's"}))
    (root / ".compile_cache").mkdir()
    (root / "notes").mkdir()
    return root


def test_the_listing_is_newest_first_with_true_statuses(tree: Path) -> None:
    found = listing.scan(str(tree), NOW)
    names = [r.name for r in found.rows]
    assert names == ["abc123_smoke_w4", "2026-12-01/14-00-00_smoke_w1", "2026-12-01/13-00-00_smoke_w2",
                     "2026-12-01/12-00-00_smoke_w2", "2026-12-01/11-00-00_smoke_w2", "2026-12-01/10-00-00_smoke_w2",
                     "2026-12-01/09-00-00_sweep"]
    by = {r.name.rsplit("/", 1)[-1]: r for r in found.rows}
    assert {k: r.status for k, r in by.items()} == {
        "abc123_smoke_w4": "completed", "14-00-00_smoke_w1": "running", "13-00-00_smoke_w2": "lost",
        "12-00-00_smoke_w2": "interrupted", "11-00-00_smoke_w2": "failed", "10-00-00_smoke_w2": "completed",
        "09-00-00_sweep": "partial"}
    done = by["10-00-00_smoke_w2"]
    assert (done.step, done.max_steps, done.last_loss, done.unit) == (8, 8, 0.75, "samples/s")
    assert done.throughput == pytest.approx(1600.0) and done.global_batch == 16 and done.world_size == 2
    assert (by["11-00-00_smoke_w2"].step, by["12-00-00_smoke_w2"].step, by["13-00-00_smoke_w2"].step) == (3, 5, 6)
    assert (by["14-00-00_smoke_w1"].step, by["14-00-00_smoke_w1"].max_steps) == (2, None)
    sweep = by["09-00-00_sweep"]
    assert [(j.name.rsplit("/", 1)[-1], j.status) for j in sweep.jobs] == [("0_smoke_w1", "completed"),
                                                                          ("job 1", "refused")]
    assert sweep.note == "2 jobs: 1 completed, 1 refused" and "not divisible" in sweep.jobs[1].note
    skipped = dict(found.skipped)
    assert set(skipped) == {"2026-12-01/15-00-00_smoke_w2", "2026-12-01/16-00-00_smoke_w2",
                            "2026-12-01/17-00-00_other"}
    assert "no run.json" in skipped["2026-12-01/15-00-00_smoke_w2"]
    assert ("run.json: not valid JSON, truncated or corrupted (JSONDecodeError"
            in skipped["2026-12-01/16-00-00_smoke_w2"])
    assert "not a ddp-run manifest" in skipped["2026-12-01/17-00-00_other"]


def test_the_command_prints_a_plain_table_notes_and_json(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert runs.main([str(tree)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "TASK", "WORLD", "GLOBAL", "BATCH", "STEP", "LAST", "LOSS",
                                "THROUGHPUT", "AGE"]
    row = next(line for line in lines if "10-00-00_smoke_w2" in line).split()
    assert row == ["2026-12-01/10-00-00_smoke_w2", "completed", "smoke", "2", "16", "8/8", "0.7500", "1,600",
                   "samples/s", "3", "h"]
    assert "2/?" in next(line for line in lines if "14-00-00_smoke_w1" in line)  # trained by epochs, still going
    assert "partial (2 jobs: 1 completed, 1 refused)  smoke  1      8 " in out
    assert "  └ 0_smoke_w1" in out and "└ job 1" in out
    assert "ddp-runs: skipped 2026-12-01/16-00-00_smoke_w2: run.json: not valid JSON" in err
    assert "Traceback" not in err
    assert runs.main([str(tree), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in data["runs"]][:3] == ["completed", "running", "lost"]
    assert {s["name"] for s in data["skipped"]} >= {"2026-12-01/17-00-00_other"}


def test_a_terminal_gets_a_rich_table(tree: Path) -> None:
    buf = io.StringIO()
    runs.rich_table(listing.scan(str(tree), NOW).rows, NOW, buf, width=200)
    text = buf.getvalue()
    assert "\x1b[" in text and "━" in text  # colours and rules: a rich table, not the plain one
    assert "10-00-00_smoke_w2" in text and "1,600 samples/s" in text
    odd = listing.Row(name="2026-12-01/[bold]x[/bold]", url="", kind="run", status="failed")
    buf = io.StringIO()
    runs.rich_table([odd], NOW, buf, width=200)
    assert "[bold]x[/bold]" in buf.getvalue()  # a name is shown as it is, never read as markup


def test_show_gives_the_cause_and_the_command_that_continues_the_run(tree: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    failed = tree / "2026-12-01/11-00-00_smoke_w2"
    ckpt = failed / layout.CHECKPOINTS / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / layout.CKPT_STATE).write_bytes(b"w")  # committed as the workers commit it: a valid marker
    (ckpt / layout.CKPT_MARKER).write_text(json.dumps({"format": checkpoints.FORMAT, "step": 2, "bytes": 1,
                                                      "sha256": "", "state_file": layout.CKPT_STATE}))
    (failed / layout.CHECKPOINTS / "step_3").mkdir()  # never committed: not offered
    assert runs.main(["show", str(failed)]) == 0
    text = capsys.readouterr().out
    assert "status      failed" in text
    assert ("root cause  earliest error on rank 1 [exception]: RuntimeError: boom (where: mytask.py:12 in forward)"
            in text)
    assert f"continue    ddp-run resume={failed}    # in place, from step_2" in text
    assert "reproduce   cd /home/me/proj && ddp-run --config-dir '/my conf' task=smoke world_size=2" in text
    assert "progress    step 3/8" in text

    assert runs.main(["show", str(tree / "2026-12-01/13-00-00_smoke_w2")]) == 0
    text = capsys.readouterr().out
    assert "lost: run.json says running, but its driver is gone (pid 1 on host gone-host" in text
    # a resume would be refused (it would start from step 0): no command that does not run
    assert "continue    — no complete checkpoint to continue from: start it again from step 0" in text
    assert "resume=" not in text
    assert runs.main(["show", str(tree / "2026-12-01/10-00-00_smoke_w2")]) == 0
    assert "continue" not in capsys.readouterr().out  # completed: reproduce only
    assert runs.main(["show", str(tree / "2026-12-01/14-00-00_smoke_w1")]) == 0
    text = capsys.readouterr().out
    assert "running: driver pid" in text and "continue" not in text


def test_bad_roots_and_directories_are_refused_in_one_line(tree: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert runs.main([str(tmp_path / "nowhere")]) == 2
    assert "no such directory. Fix: pass the output root" in capsys.readouterr().err
    assert runs.main(["show", str(tree / "2026-12-01/17-00-00_other")]) == 2
    assert "not a run directory (run.json is not a ddp-run manifest)" in capsys.readouterr().err
    assert runs.main(["show", str(tmp_path / "nowhere")]) == 2
    assert runs.main(["show", str(tree / "2026-12-01/09-00-00_sweep")]) == 2
    assert "is a sweep, not one run. Fix: ddp-runs" in capsys.readouterr().err
    assert runs.main(["show"]) == 2 and runs.main(["a", "b"]) == 2
    (tmp_path / "empty").mkdir()
    assert runs.main([str(tmp_path / "empty")]) == 0
    assert "ddp-runs: no runs under" in capsys.readouterr().out
    # a run directory or a sweep directory given as the root lists just that
    assert [r.name for r in listing.scan(str(tree / "2026-12-01/10-00-00_smoke_w2")).rows] == ["10-00-00_smoke_w2"]
    assert [r.kind for r in listing.scan(str(tree / "2026-12-01/09-00-00_sweep")).rows] == ["sweep"]


def test_a_continued_run_reads_as_running_with_its_live_figures(tmp_path: Path) -> None:
    """A run continued in place: run.json says running (its new driver, alive), summary.json is still the earlier
    attempt's (interrupted, with figures): the listing and ddp-compare believe run.json, and the step is the live
    one."""
    from ddp_runner.report import compare

    earlier = {"status": "interrupted", "global_batch": 16, "steps": 3, "losses": [2.0, 1.0],
               "median": {"step_time_s": 0.01}}
    run = _run(tmp_path / "outputs" / "2026-12-01", "10-00-00_smoke_w2",
               _manifest("running", driver=this_driver()), earlier, step=6)
    [row] = listing.scan(str(tmp_path / "outputs"), NOW).rows
    assert (row.status, row.step) == ("running", 6)
    assert compare.load_run(run).status == "running"


def test_a_failed_run_is_listed_at_the_furthest_step_any_rank_recorded(tmp_path: Path) -> None:
    # Rank 1 raised after its step 3; its peer was stopped before it recorded step 3 (it was still in its optimizer
    # step when the agent killed it). The run reached step 3; rank 0's record alone would say 2.
    run = _run(tmp_path, "11-00-00_smoke_w2", _manifest("failed"), {"status": "failed"}, step=2)
    (run / layout.rank_progress(1)).write_text(json.dumps({"rank": 1, "step": 3, "phase": "step_end"}))
    (run / layout.rank_progress(2)).write_text("{cut sho")  # not a rank of this plan, and unreadable: not read
    [row] = listing.scan(str(run), NOW).rows
    assert (row.status, row.step) == ("failed", 3)
    (run / layout.rank_progress(1)).write_text("{cut sho")  # a record cut short is skipped, not a traceback
    [row] = listing.scan(str(run), NOW).rows
    assert row.step == 2
