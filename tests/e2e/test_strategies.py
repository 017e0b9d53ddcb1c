"""strategy=zero1 and strategy=fsdp end to end through the CLI on CPU (2 gloo ranks, the tiny GPT).

- Same losses as DDP. fp32 with accumulation 2 and clipping: the strategies compute the same sums in another
  order (FSDP2 reduce-scatters, then each rank clips and steps its shard), so losses agree to 1e-4 relative, not
  bit for bit.
- A killed run resumed in place gives exactly the uninterrupted run's losses (bit-identical; fsdp in bf16 with
  dropout, the session's ``gpt_fsdp_reference`` that test_stops.py resumes to as well, so the mixed-precision policy
  and the ranks' RNG are covered too).
- A checkpoint from 2 ranks resumes on 1 at the same global batch (fsdp: DCP reshards on load; zero1: the
  optimizer state was consolidated) and continues with the 2-rank run's losses to 1e-3 relative.

One fp32 run per strategy (``strategy_run``, made once per session, on the recipe of the session's world sweep,
whose 2-rank job is the DDP run they are compared with) is both the comparison with DDP and the uninterrupted run
that the zero1 kill and the one-rank resumes are checked against.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.recipes import GPT_DROPOUT_STEPS, GPT_WORLD_SWEEP, GPT_ZERO1_KILL0, gpt_fsdp_args
from tests.support.run_tree import copy_run, load_json, run_dirs
from tests.support.shared_runs import shared_run

VAL_SAMPLES = 16  # what a run of the world sweep's recipe validates on here (the losses compared do not depend on it)


def _args(strategy: str, *extra: str) -> list[str]:
    """The session's world-sweep recipe (recipes.GPT_WORLD_SWEEP: the tiny GPT, fp32, micro-batches of 2 at a
    global batch of 24, 12 steps, a loss logged every 2, a synchronous checkpoint every 2) on 2 ranks (accumulation
    6), every checkpoint kept (step_8 stays for the one-rank resume). Under ``strategy=ddp`` it is the sweep's
    2-rank job."""
    return [*GPT_WORLD_SWEEP, "world_size=2", "checkpoint.keep_last=0", f"strategy={strategy}", *extra]


def _run(args: list[str], root: Path, env: dict[str, str] | None = None, ok: bool = True) -> Path:
    r = ddp_run(args, root, env=env)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    [run] = run_dirs(root)
    return run


def _losses(run: Path) -> list[float]:
    return load_json(run / "summary.json")["losses"]


@pytest.fixture(scope="session")
def strategy_run(tmp_path_factory: pytest.TempPathFactory):
    """``strategy_run(name)``: the uninterrupted run of :func:`_args` under zero1 or fsdp (once per session), its
    final validation on the first VAL_SAMPLES samples (nothing here reads a validation loss)."""
    return lambda strategy: shared_run(tmp_path_factory, f"gpt-strategy-{strategy}",
                                       lambda root: _run([*_args(strategy), f"train.val_samples={VAL_SAMPLES}"], root))


def test_zero1_and_fsdp_train_to_ddps_losses(strategy_run, gpt_world_sweep):
    [ddp] = [p for p in run_dirs(gpt_world_sweep) if load_json(p / "run.json")["plan"]["world_size"] == 2]
    assert load_json(ddp / "run.json")["plan"]["accumulation"] == 6
    losses = {"ddp": _losses(ddp), **{s: _losses(strategy_run(s)) for s in ("zero1", "fsdp")}}
    assert len(losses["ddp"]) == 6 and losses["ddp"][-1] < losses["ddp"][0]  # logged at steps 2, 4, ... 12
    for s in ("zero1", "fsdp"):
        assert len(losses[s]) == len(losses["ddp"])
        for a, b in zip(losses[s], losses["ddp"], strict=True):
            assert math.isclose(a, b, rel_tol=1e-4), (s, losses[s], losses["ddp"])


@pytest.mark.timeout(600)  # up to three CLI runs (and the uninterrupted one, where no other test made it yet)
@pytest.mark.parametrize("strategy,precision", [("fsdp", "bf16"), ("zero1", "fp32")])
def test_kill_resume_is_bit_identical_and_resumes_on_one_rank(tmp_path, text_file, strategy, precision,
                                                              strategy_run, request):
    # A rank is SIGKILLed after step 7: the newest complete checkpoint is step_4 (a checkpoint every 4) or step_6
    # (every 2); resumed in place.
    if strategy == "fsdp":  # bf16 with dropout: the session's fsdp run that test_stops.py resumes to as well
        args, clean, newest = gpt_fsdp_args(text_file), request.getfixturevalue("gpt_fsdp_reference"), "step_4"
        assert f"train.precision={precision}" in args
        assert len(_losses(clean)) == GPT_DROPOUT_STEPS == 16
        crashed = _run([*args, "fault.kind=sigkill", "fault.rank=1", "fault.step=7"], tmp_path / "crash", ok=False)
    else:  # rank 0 killed: the session's failed zero1 run (the e2e conftest's gpt_zero1_crashed, its exit code asserted
        # non-zero there; test_diagnostics_e2e.py reads its attribution), continued here as a copy
        args, clean, newest = _args(strategy, f"train.precision={precision}"), strategy_run(strategy), "step_6"
        assert len(_losses(clean)) == 6
        assert GPT_ZERO1_KILL0 == [*args, "fault.kind=sigkill", "fault.rank=0", "fault.step=7"]
        crashed = copy_run(request.getfixturevalue("gpt_zero1_crashed"), tmp_path / "crash")
    assert load_json(crashed / "run.json")["status"] == "failed"
    assert ck.latest(f"{crashed}/checkpoints").endswith(newest)
    # zero1: the world sweep's recipe validates on a slice of the default corpus; the first VAL_SAMPLES samples of it
    # do here (a key that may change on resume; the losses and weights compared do not depend on it).
    fewer = [f"train.val_samples={VAL_SAMPLES}"] if strategy == "zero1" else []
    r = ddp_run([f"resume={crashed}", *fewer], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_json(crashed / "summary.json")["resumed_from"].endswith(newest)
    assert _losses(crashed) == _losses(clean)
    last = ck.latest(f"{clean}/checkpoints")
    if strategy == "fsdp":  # sharded: one DCP file per rank, and the last checkpoint's consolidated model
        step = Path(last)
        assert sorted(p.name for p in (step / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        model = torch.load(step / "model.pt", weights_only=True)
        assert model["tok.weight"].shape == (256, 64) and model["tok.weight"].dtype == torch.float32
        assert set(load_json(step / "meta.json")["files"]) >= {"model.pt", "shards/.metadata"}

    # step_8 of the 2-rank fp32 run (no dropout: one rank draws other masks than two) on one rank, same global
    # batch (accumulation 12): the same losses up to step 8 (logged at 2, 4, 6, 8), then the same to 1e-3.
    clean, args = strategy_run(strategy), _args(strategy)
    one = [a for a in args if not a.startswith("world_size")] + ["world_size=1", f"resume={clean}/checkpoints/step_8",
                                                                 f"train.val_samples={VAL_SAMPLES}"]
    single = _run(one, tmp_path / "one")
    assert load_json(single / "summary.json")["resumed_from"].endswith("step_8")
    a, b = _losses(single), _losses(clean)
    assert a[:4] == b[:4] and len(a) == 6
    for x, y in zip(a[4:], b[4:], strict=True):
        assert math.isclose(x, y, rel_tol=1e-3), (a, b)
