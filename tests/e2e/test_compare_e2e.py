"""ddp-compare: a report over real runs (the session's 1-2-3-4-rank fixed-global-batch sweep of the tiny GPT, and
a run that failed), and a sweep's record of every job, a refused one too."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re

import pytest

from tests.support.run_tree import load_json, run_dirs
from tests.support.shared_runs import shared_console


def test_report_over_a_fixed_global_batch_sweep_and_a_failed_run(tmp_path, gpt_world_sweep, gpt_failed_run):
    sweep = gpt_world_sweep  # 1, 2, 3 and 4 ranks at a global batch of 24, 12 steps (tests/e2e/conftest.py)
    console = (sweep.parent / "console.txt").read_text()
    # The sweep's settings at world_size=2, another learning rate and rank 1 raising at step 3 (GPT_FAILED).
    failed = gpt_failed_run
    assert shared_console(failed)["rc"] != 0
    out = tmp_path / "report"
    # ddp-compare's main() in this process (its `python -m` entry point runs in test_projection_e2e.py and in
    # bench/scaling_study.py's dry run): the same report, without a fresh interpreter importing it all again.
    from ddp_runner.report import compare

    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        rc = compare.main([str(sweep), str(failed), "--out", str(out), "--price", "3"])
    assert rc == 0, errors.getvalue()
    for name in ("report.md", "report.csv", "throughput.png", "loss_vs_step.png", "loss_vs_time.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = {row["run"]: row for row in csv.DictReader((out / "report.csv").open())}
    assert set(table) == {p.name for p in run_dirs(sweep)} | {failed.name}
    assert table[failed.name]["status"] == "failed" and "rank 1" in table[failed.name]["bottleneck"]
    for run in run_dirs(sweep):  # the numbers are the runs' own
        summary, manifest = load_json(run / "summary.json"), load_json(run / "run.json")
        row = table[run.name]
        assert int(row["world"]) == manifest["plan"]["world_size"] and int(row["global_batch"]) == 24
        assert float(row["rate"]) == pytest.approx(summary["median"]["tokens_per_s"], rel=1e-6)
        assert float(row["final_loss"]) == pytest.approx(summary["losses"][-1])
        assert row["device"] == "cpu" and row["gpu_hours"] == row["cost"] == ""  # no GPU-hours on a CPU
    w1 = next(r for r in table.values() if r["world"] == "1")
    w2 = next(r for r in table.values() if r["world"] == "2" and r["status"] == "completed")
    assert float(w2["efficiency"]) == pytest.approx(float(w2["rate"]) / 2 / float(w1["rate"]))
    # Where each step's time goes, on every rank: summary.json, TensorBoard, the console, the bottleneck sentence.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in run_dirs(sweep):
        world = load_json(run / "run.json")["plan"]["world_size"]
        tb = load_json(run / "summary.json")["time_breakdown"]
        assert set(tb["per_rank"]) == {str(r) for r in range(world)}, tb
        for v in tb["per_rank"].values():
            parts = v["data_ms"] + v["compute_ms"] + v["exposed_sync_ms"] + v["optimizer_ms"]
            assert v["step_ms"] == pytest.approx(parts) and v["compute_ms"] > 0
        assert (max(v["exposed_sync_ms"] for v in tb["per_rank"].values()) > 0) == (world > 1)  # gloo: never hidden
        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        assert {f"time/rank{r}/exposed_sync_ms" for r in range(world)} <= set(acc.Tags()["scalars"])
    # A sweep's console closes each job with one line (its breakdown is in its summary.json; the per-rank table of
    # a longer run of its own: tests/e2e/test_gpt.py) and the sweep with one table of its jobs (issue 43, item 4).
    assert len(re.findall(r"^ddp-run: job \d completed: 12 steps, ", console, re.M)) == 4, console
    assert "ddp-run: completed:" not in console and "each rank" not in console, console
    assert len(re.findall(r"^  job  world_size  status ", console, re.M)) == 1, console
    assert "of each step waits for gradient sync" in w2["bottleneck"] and w2["exposed_sync_share"]
    report = (out / "report.md").read_text()
    # The failed run used another learning rate (and a rehearsal fault): both are listed as differing settings.
    assert "other settings differ:" in report and "train.lr (" in report and "fault.kind (" in report
    assert "| failed ⚠ |" in report
    assert "| GPU-hours |" not in report and "$" not in report and "CPU runs only: no GPU-hours or cost" in report
    assert all(line.startswith(f"- {name} (") for line, name in zip(
        report.split("## Where the time goes")[1].split("\n## ")[0].strip().splitlines(), sorted(table, key=lambda n: (
            int(table[n]["world"]), n)), strict=True)), "every bottleneck sentence names its run"
    assert json.dumps(table)  # parses as plain data


def test_a_sweep_records_every_job_even_a_refused_one(smoke_lr_sweep):
    # world_size=1,2 × train.lr=0.01,0.05 at batch.global=24 (tests/support/recipes.py: SMOKE_LR_SWEEP)
    sweep_dir, r = smoke_lr_sweep, shared_console(smoke_lr_sweep)
    assert r["rc"] == 2, r["stderr"]  # some job was refused: the sweep says so in its exit code
    record = json.loads((sweep_dir / "sweep.json").read_text())
    status = {(j["values"]["world_size"], j["values"]["train.lr"]): j["status"] for j in record["jobs"]}
    assert status == {("1", "0.01"): "completed", ("1", "0.05"): "completed",
                      ("2", "0.01"): "refused", ("2", "0.05"): "refused"}
    names = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert names == ["0_smoke_w1_lr=0.01", "1_smoke_w1_lr=0.05"]
    assert (sweep_dir / "multirun.yaml").is_file() and "refused" in (sweep_dir / "sweep.md").read_text()
    # TensorBoard over the sweep directory: each job a run of its own, its swept values in the HPARAMS table.
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(sweep_dir))
    mux.Reload()
    assert sorted(mux.Runs()) == [f"{n}/tb" for n in names]
    for name, lr in zip(names, (0.01, 0.05), strict=True):
        content = mux.PluginRunToTagToContent("hparams")[f"{name}/tb"]["_hparams_/session_start_info"]
        hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
        assert hparams["train.lr"].number_value == pytest.approx(lr) and hparams["world_size"].number_value == 1
    before, after = r["cwd_multirun_yaml"]
    assert before == after, "Hydra's multirun.yaml landed in the working directory"
