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


def _main(argv: list[str]) -> int:
    """ddp-compare's exit code: argparse's own refusals (an option's type) exit rather than return."""
    try:
        return compare.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(("args", "message"), [
    (["--calibrate", "1,2"], "--calibrate needs --project. Fix: add --project N,N,…"),
    (["--project", "8", "--link-gbps", "0"], "--link-gbps=0.0: must be > 0"),
    (["--project", "8", "--links", "/nonexistent.json"], "--links=/nonexistent.json: no such file"),
    (["--project", "8,,64"], "argument --project: 8,,64: an empty world size between commas. Fix: world sizes"),
    (["--project", "8", "--calibrate", "1,x"], "argument --calibrate: 1,x: not whole numbers. Fix:"),
    (["--project", "8", "--inter-node-gbps", "nan"],
     "--inter-node-gbps=nan: must be > 0, a finite number. Fix: give the bus bandwidth between nodes per rank in "
     "GB/s, e.g. --inter-node-gbps 50"),
    (["--project", "8", "--link-gbps", "inf"], "--link-gbps=inf: must be > 0, a finite number"),
    (["--project", "8", "--inter-node-latency-us", "-1"], "--inter-node-latency-us=-1.0: must be >= 0"),
    (["--project", "8", "--calibrate", "1,7"],
     "--calibrate=1,7: no completed run with a time breakdown has 7 ranks. Fix: name measured world sizes "
     "(measured: 1, 2, 3, 4)"),
])
def test_wrong_projection_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                              message: str) -> None:
    runs = _sweep(tmp_path / "runs")
    assert _main([str(runs), "--out", str(tmp_path / "r"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / "report.md").exists()


@pytest.mark.parametrize(("body", "message"), [
    ('{"checks": "nope"}', "holds no all-reduce bandwidth measurement in ddp-doctor's shape"),
    ('{"checks": [{"name": "bandwidth", "data": {"rows": "x", "nranks": 2}}]}', "in ddp-doctor's shape"),
    ('{"checks": [7]}', "in ddp-doctor's shape"),
    ("{not json", "not JSON (Expecting property name"),
    ("[1, 2]", "JSON, but a list, not ddp-doctor's report"),
])
def test_a_links_file_of_the_wrong_shape_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                                    message: str) -> None:
    runs, links = _sweep(tmp_path / "runs"), tmp_path / "doctor.json"
    links.write_text(body)
    assert _main([str(runs), "--out", str(tmp_path / "r"), "--project", "8", "--links", str(links)]) == 2
    err = capsys.readouterr().err
    assert f"ddp-compare: error: --links={links}: " in err and message in err
    assert "Fix: write it with `ddp-doctor --json > doctor.json`" in err


def _section(runs: Path, out: Path, *extra: str) -> str:
    assert compare.main([str(runs), "--out", str(out), "--project", "8,64,512", *extra]) == 0
    return (out / "report.md").read_text().split("# Scaling projection")[1]


def _fail(run: Path) -> None:
    for name in (layout.MANIFEST, layout.SUMMARY):
        record = json.loads((run / name).read_text())
        record["status"] = "failed"
        (run / name).write_text(json.dumps(record))


def test_one_and_two_ranks_project_the_rest_and_say_the_error_needs_a_third(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for w in (1, 2):
        _write(runs, w)
    section = _section(runs, tmp_path / "report")
    assert "No projection" not in section and "measure 2 ranks" not in section
    assert "Fitted to the runs with 1 and 2 ranks (0_gpt_w1, 1_gpt_w2)" in section
    assert "The projection's error needs a third world size (measure e.g. 4 ranks too" in section
    assert "| 512 † |" in section


def test_a_sweep_whose_larger_run_failed_fits_the_others_and_says_so(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for w in (1, 2, 3):
        _write(runs, w)
    _fail(runs / "2_gpt_w3")
    section = _section(runs, tmp_path / "report")
    assert "Fitted to the runs with 1 and 2 ranks (0_gpt_w1, 1_gpt_w2)" in section
    assert "none is left to check it (2_gpt_w3, 3 ranks: failed, not completed)" in section
    assert "needs a third world size (rerun 3 ranks: the smaller half" in section
    _fail(runs / "1_gpt_w2")  # now no run of 2 or more ranks priced the communication
    section = _section(runs, tmp_path / "report2")
    assert ("No projection: nothing says what communication costs: no link was measured, and no run of 2 or more "
            "ranks completed with a time breakdown (1_gpt_w2, 2 ranks: failed, not completed; 2_gpt_w3, 3 ranks: "
            "failed, not completed). Fix: rerun one of them, or measure the link (`ddp-doctor --json > doctor.json`)"
            " and pass --links doctor.json") in section


def test_a_calibration_without_a_synchronising_run_names_the_one_measured(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for w in (1, 2):
        _write(runs, w)
    section = _section(runs, tmp_path / "report", "--calibrate", "1")
    assert ("No projection: nothing says what communication costs: no link was measured, and --calibrate 1 fits no "
            "run of 2 or more ranks (the measured runs of 2 ranks are left out of it). Fix: fit one of them too (e.g. "
            "--calibrate 1,2), or measure the link") in section
    assert "measure 2 ranks" not in section


def test_with_a_measured_link_one_rank_fits_and_two_checks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for w in (1, 2):
        _write(runs, w)
    section = _section(runs, tmp_path / "report", "--link-gbps", "0.5", "--link-latency-us", "100")
    assert "Fitted to the runs with 1 rank (0_gpt_w1)" in section
    assert "| 2 | 1_gpt_w2 |" in section  # the check's table


def test_measured_rows_show_what_was_measured_and_the_projection_under_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for w in (1, 2, 3):
        _write(runs, w)
    summary = json.loads((runs / "2_gpt_w3" / layout.SUMMARY).read_text())
    step = summary["median"]["step_time_s"] = 0.8 * summary["median"]["step_time_s"]  # faster than modelled
    summary["median"]["tokens_per_s"] /= 0.8
    (runs / "2_gpt_w3" / layout.SUMMARY).write_text(json.dumps(summary))
    section = _section(runs, tmp_path / "report")
    table = section.split("| ranks | step (global) |")[1].split("\n\n")[0]  # the projected table, not the check's
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| 3 ")}
    assert set(rows) == {"3 measured", "3 projected"}
    measured = rows["3 measured"].strip("| ").split(" | ")
    assert measured[1:3] == [f"{1000 * step:.1f} ms", f"{24 * 64 / step:,.0f}"]
    assert measured[5:9] == ["—"] * 4  # it did not run at the fixed per-rank batch
    csv_rows = list(csv.DictReader((tmp_path / "report" / "projection.csv").open()))
    projected = [r for r in csv_rows if r["world"] == "3" and r["mode"] == P.FIXED_GLOBAL][0]
    assert float(projected["measured_rate"]) == pytest.approx(24 * 64 / step)
    assert rows["3 projected"].split(" | ")[2] == f"{float(projected['rate']):,.0f}" != measured[2]
    assert "| 8 † |" in table and "| 1 measured |" in table and "| 1 projected |" in table


def test_one_world_size_calibrates_on_itself_and_says_what_a_check_needs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _write(runs, 2)
    section = _section(runs, tmp_path / "report")
    assert "Fitted to the runs with 2 ranks (1_gpt_w2)" in section
    assert "Only 2 ranks measured: the projection's error needs a second world size to check it against." in section
    assert "--calibrate" not in section  # nothing to fit on fewer of
