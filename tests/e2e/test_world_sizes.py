"""Nothing assumes two ranks: a 1-2-3-4 fixed-global-batch sweep of the tiny GPT (every rank of every job ran,
logged and exited 0) read back by the compare report, and its 1-, 3- and 4-rank jobs killed on the last rank, resumed
to the same losses and final parameters bit for bit. The sweep is the session's `gpt_world_sweep`
(tests/e2e/conftest.py), which test_compare_e2e.py reads too."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from ddp_runner.report import compare
from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.recipes import GPT_WORLD_SWEEP
from tests.support.run_tree import load_json, run_dirs

VAL_SAMPLES = 16


def _job(sweep: Path, world: int) -> Path:
    [run] = [p for p in run_dirs(sweep) if load_json(p / "run.json")["plan"]["world_size"] == world]
    return run


def _final_model(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(ck.latest(f"{run}/checkpoints")) / "state.pt", weights_only=False)["model"]


@pytest.mark.timeout(600)  # two CLI runs (and the sweep, where no other test made it yet)
@pytest.mark.parametrize("world", [1, 3, 4])
def test_gpt_killed_on_the_last_rank_resumes_bit_for_bit(tmp_path: Path, gpt_world_sweep: Path, world: int) -> None:
    # The sweep's job, except that its final validation (after the resume) reads the first VAL_SAMPLES samples of
    # its split instead of all of them (about half a CPU-second per rank on a 2-core machine): the training losses
    # and weights compared here do not depend on it.
    crash_root = tmp_path / "crash"
    r = ddp_run([*GPT_WORLD_SWEEP, f"world_size={world}", f"train.val_samples={VAL_SAMPLES}", "fault.kind=sigkill",
                 f"fault.rank={world - 1}", "fault.step=5"], crash_root)
    assert r.returncode != 0, r.stdout + r.stderr
    [crashed] = run_dirs(crash_root)
    assert load_json(crashed / "summary.json")["root_cause"]["rank"] == world - 1
    r = ddp_run([f"resume={crashed}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(checkpoint step_4); the uninterrupted run's losses, bit for bit" in r.stdout  # the line's promise
    clean_run = _job(gpt_world_sweep, world)
    resumed, clean = load_json(crashed / "summary.json"), load_json(clean_run / "summary.json")
    assert resumed["resumed_from"].endswith("checkpoints/step_4")
    assert len(resumed["losses"]) == len(clean["losses"]) == 6  # one per logged step: steps 2, 4, ... 12
    # Every logged step bit for bit, the ones after the resume too: with three or more ranks the sum depends on
    # the order, and the resumed launch reduces in the buckets the uninterrupted run had rebuilt by then.
    assert resumed["losses"] == clean["losses"]
    mine, theirs = _final_model(crashed), _final_model(clean_run)
    assert mine.keys() == theirs.keys() and len(mine) > 4
    for k in theirs:
        assert torch.equal(mine[k], theirs[k]), k


def test_fixed_global_batch_sweep_over_one_to_four_ranks_and_its_report(tmp_path: Path, gpt_world_sweep: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    runs = run_dirs(gpt_world_sweep)
    assert len(runs) == 4
    accum = {load_json(p / "run.json")["plan"]["world_size"]: load_json(p / "run.json")["plan"]["accumulation"]
             for p in runs}
    assert accum == {1: 12, 2: 6, 3: 4, 4: 3}
    for run in runs:  # nothing assumes two ranks: every rank of every job ran, logged and exited 0
        manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
        world = manifest["plan"]["world_size"]
        assert manifest["plan"]["global_batch"] == 24 and summary["status"] == "completed"
        assert manifest["exit_codes"] == {str(r): 0 for r in range(world)}
        assert sorted(p.name for p in (run / "logs").glob("rank*.log")) == [f"rank{r}.log" for r in range(world)]
    # ddp-compare's main() in this process (its console entry, `python -m ddp_runner.report.compare`, is run as a
    # command by test_compare_e2e.py and test_projection_e2e.py): the same report without a new interpreter.
    out = tmp_path / "report"
    code = compare.main([str(gpt_world_sweep), "--out", str(out)])
    assert code == 0, capsys.readouterr()
    table = list(csv.DictReader((out / "report.csv").open()))
    assert sorted(int(row["world"]) for row in table) == [1, 2, 3, 4]
    base = next(row for row in table if row["world"] == "1")
    for row in table:
        assert row["status"] == "completed" and int(row["global_batch"]) == 24
        world = int(row["world"])
        assert float(row["efficiency"]) == pytest.approx(float(row["rate"]) / world / float(base["rate"]))
