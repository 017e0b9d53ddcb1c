"""``ddp-compare --project``: run directories as the runner leaves them (made here by a known model) → the report's
projection section, projection.csv and projection.png; the links from a ddp-doctor report; refused options."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddp_runner.contract import layout, scaling
from ddp_runner.report import compare
from ddp_runner.report import projection as P

GRAD = 4e6
LINK = P.Link(100e-6, 0.5)  # a gloo-like link: 0.5 GB/s busbw


def _write(root: Path, world: int, *, cores: int = 16, sample_s: float = 0.01, exposure: float = 0.7) -> Path:
    """A completed run of the tiny GPT at global batch 24 (micro-batch 2), its step made by the model."""
    run = root / f"{world - 1}_gpt_w{world}"
    run.mkdir(parents=True)
    spr = 24 / world
    plan_ = P.collectives("ddp", GRAD, GRAD, spr / 2, 25)
    kappa = P.contention(world, "cpu", cores)
    comm = kappa * exposure * P.comm_s(plan_, world, LINK) if world > 1 else 0.0
    work, opt = kappa * sample_s * spr, kappa * 0.002
    step = work + opt + comm
    plan = {"world_size": world, "per_rank_batch": 2, "accumulation": int(spr / 2), "global_batch": 24,
            "device": "cpu", "nproc_per_node": world}
    (run / layout.MANIFEST).write_text(json.dumps({"status": "completed", "task": "gpt", "plan": plan}))
    shares = {"data": 0.0, "compute": work / step, "exposed_sync": comm / step, "optimizer": opt / step}
    summary = {"status": "completed", "global_batch": 24, "steps": 60, "losses": [4.0, 3.0],
               "median": {"step_time_s": step, "tokens_per_s": 24 * 64 / step},
               "perf_windows": {"step_time_s": [step * 0.99, step, step * 1.01]},
               "time_breakdown": {"per_rank": {"0": {"step_ms": 1000 * step}}, "shares": shares, "slowest_rank": 0},
               scaling.SUMMARY_KEY: {scaling.GRAD_BYTES: GRAD, scaling.PARAM_BYTES: GRAD, scaling.THREADS: 1,
                                     scaling.CORES: cores, scaling.LOCAL_WORLD: world}}
    (run / layout.SUMMARY).write_text(json.dumps(summary))
    return run


def _sweep(root: Path, **kw: float) -> Path:
    for w in (1, 2, 3, 4):
        _write(root, w, **kw)
    return root


def test_the_report_fits_on_one_and_two_ranks_and_checks_three_and_four(tmp_path: Path) -> None:
    runs, out = _sweep(tmp_path / "runs"), tmp_path / "report"
    assert compare.main([str(runs), "--out", str(out), "--project", "8,64,512"]) == 0
    report = (out / "report.md").read_text()
    section = report.split("# Scaling projection")[1]
    assert "Fitted to the runs with 1 and 2 ranks (0_gpt_w1, 1_gpt_w2)" in section
    assert "All within 10%" in section and "| 512 † |" in section
    assert "priced on the node's own link, since no --inter-node-gbps was given: optimistic" in section
    rows = list(csv.DictReader((out / "projection.csv").open()))
    errors = {int(r["world"]): float(r["error"]) for r in rows if r["error"]}
    assert sorted(errors) == [3, 4] and max(map(abs, errors.values())) < 0.01
    assert {int(r["world"]) for r in rows} == {1, 2, 3, 4, 8, 64, 512}
    big = [r for r in rows if r["world"] == "512" and r["mode"] == P.FIXED_GLOBAL][0]
    assert big["feasible"] == "False"  # 24 samples cannot feed 512 ranks at a fixed global batch
    assert (out / "projection.png").stat().st_size > 10_000


def test_a_miss_is_explained_by_the_shared_cores_and_the_runs_spread(tmp_path: Path) -> None:
    runs = _sweep(tmp_path / "runs", cores=2)
    # The 4-rank run went faster than 4 ranks on 2 cores can (another tenant left): the model misses it.
    summary = json.loads((runs / "3_gpt_w4" / layout.SUMMARY).read_text())
    summary["median"]["step_time_s"] *= 0.7
    summary["median"]["tokens_per_s"] /= 0.7
    (runs / "3_gpt_w4" / layout.SUMMARY).write_text(json.dumps(summary))
    out = tmp_path / "report"
    assert compare.main([str(runs), "--out", str(out), "--project", "8"]) == 0
    section = (out / "report.md").read_text().split("# Scaling projection")[1]
    assert "Goal missed: -29.9% at 4 ranks" in section  # 0.7 of the step, less the tokens per sample's rounding
    assert "the runs with 3, 4 ranks had more ranks than the host's 2 cores" in section


def test_a_doctor_report_prices_the_link_and_the_runs_give_the_overlap(tmp_path: Path) -> None:
    runs, out = _sweep(tmp_path / "runs"), tmp_path / "report"
    rows = [{"bytes": b, "time_us": 1e6 * P.collective_s("all_reduce", b, 2, LINK)} for b in (1 << 20, 1 << 24)]
    doctor = {"status": "ok", "checks": [{"name": "bandwidth", "status": "ok", "summary": "",
                                          "data": {"backend": "gloo", "nranks": 2, "rows": rows}}]}
    (tmp_path / "doctor.json").write_text(json.dumps(doctor))
    assert compare.main([str(runs), "--out", str(out), "--project", "16", "--links", str(tmp_path / "doctor.json"),
                         "--calibrate", "1,2,3"]) == 0
    section = (out / "report.md").read_text().split("# Scaling projection")[1]
    assert "ρ = 0.70" in section and "busbw 0.5 GB/s (ddp-doctor, doctor.json (gloo, 2 ranks))" in section
    assert "Fitted to the runs with 1 and 2 and 3 ranks" in section


@pytest.mark.parametrize(("args", "message"), [
    (["--calibrate", "1,2"], "--calibrate needs --project"),
    (["--project", "8", "--link-gbps", "0"], "--link-gbps=0.0: must be > 0"),
    (["--project", "8", "--links", "/nonexistent.json"], "--links=/nonexistent.json: no such file"),
])
def test_wrong_projection_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                              message: str) -> None:
    runs = _sweep(tmp_path / "runs")
    assert compare.main([str(runs), "--out", str(tmp_path / "r"), *args]) == 2
    assert message in capsys.readouterr().err


def test_no_projection_when_the_calibration_names_an_unmeasured_world(tmp_path: Path) -> None:
    runs, out = _sweep(tmp_path / "runs"), tmp_path / "report"
    assert compare.main([str(runs), "--out", str(out), "--project", "8", "--calibrate", "1,5"]) == 0
    assert "No projection: --calibrate names world sizes no run measured: 5." in (out / "report.md").read_text()
    assert not (out / "projection.png").exists()
