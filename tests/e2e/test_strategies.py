"""strategy=zero1 and strategy=fsdp end to end through the CLI on CPU (2 gloo ranks, the tiny GPT).

- Same losses as DDP. fp32 with accumulation 2 and clipping: the strategies compute the same sums in another
  order (FSDP2 reduce-scatters, then each rank clips and steps its shard), so losses agree to 1e-4 relative, not
  bit for bit.
- A killed run resumed in place gives exactly the uninterrupted run's losses (bit-identical; fsdp in bf16 with
  dropout, the session's ``gpt_fsdp_reference`` that test_stops.py resumes to as well, so the mixed-precision policy
  and the ranks' RNG are covered too).
- A checkpoint from 2 ranks resumes on 1 at the same global batch (fsdp: DCP reshards on load; zero1: the
  optimizer state was consolidated) and continues with the 2-rank run's losses to 1e-3 relative.

One fp32 run per strategy (``strategy_run``, made once per session) is both the comparison with DDP and the
uninterrupted run that the zero1 kill and the one-rank resumes are checked against.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import GPT_DROPOUT_STEPS, ddp_run, gpt_fsdp_args, load_json, run_dirs, shared_run

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddp_runner.tasks.engine import checkpoint as ck  # noqa: E402


def _args(text_file: Path, strategy: str, *extra: str) -> list[str]:
    """The tiny GPT, fp32, 2 ranks, micro-batches of 2 with accumulation 2 (global batch 8): 8 optimizer steps per
    epoch, 2 epochs; a synchronous checkpoint every 4 (keep_last 0: step_12 stays for the one-rank resume)."""
    return ["task=gpt", "device=cpu", "world_size=2", f"data.path={text_file}", "batch.per_rank=2",
            "batch.accumulation=2", "train.max_steps=null", "train.epochs=2", "checkpoint.every_steps=4",
            "checkpoint.keep_last=0", "checkpoint.async_save=false", f"strategy={strategy}", *extra]


def _run(args: list[str], root: Path, env: dict[str, str] | None = None, ok: bool = True) -> Path:
    r = ddp_run(args, root, env=env)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    [run] = run_dirs(root)
    return run


def _losses(run: Path) -> list[float]:
    return load_json(run / "summary.json")["losses"]


@pytest.fixture(scope="session")
def strategy_run(tmp_path_factory: pytest.TempPathFactory, text_file: Path):
    """``strategy_run(name)``: the uninterrupted fp32 run of :func:`_args` under that strategy (once per session)."""
    return lambda strategy: shared_run(tmp_path_factory, f"gpt-strategy-{strategy}",
                                       lambda root: _run(_args(text_file, strategy), root))


def test_zero1_and_fsdp_train_to_ddps_losses(strategy_run):
    losses = {s: _losses(strategy_run(s)) for s in ("ddp", "zero1", "fsdp")}
    assert len(losses["ddp"]) == 16 and losses["ddp"][-1] < losses["ddp"][0]
    for s in ("zero1", "fsdp"):
        assert len(losses[s]) == len(losses["ddp"])
        for a, b in zip(losses[s], losses["ddp"], strict=True):
            assert math.isclose(a, b, rel_tol=1e-4), (s, losses[s], losses["ddp"])


@pytest.mark.timeout(600)  # three CLI runs (and the uninterrupted one, where no other test made it yet)
@pytest.mark.parametrize("strategy,precision", [("fsdp", "bf16"), ("zero1", "fp32")])
def test_kill_resume_is_bit_identical_and_resumes_on_one_rank(tmp_path, text_file, strategy, precision,
                                                              strategy_run, request):
    if strategy == "fsdp":  # bf16 with dropout: the session's fsdp run that test_stops.py resumes to as well
        args, clean = gpt_fsdp_args(text_file), request.getfixturevalue("gpt_fsdp_reference")
        assert f"train.precision={precision}" in args
    else:
        args, clean = _args(text_file, strategy, f"train.precision={precision}"), strategy_run(strategy)
    assert len(_losses(clean)) == GPT_DROPOUT_STEPS == 16

    # Rank 1 is SIGKILLed after step 7: step_4 is the newest complete checkpoint; resumed in place.
    crashed = _run([*args, "fault.kind=sigkill", "fault.rank=1", "fault.step=7"], tmp_path / "crash", ok=False)
    assert ck.latest(f"{crashed}/checkpoints").endswith("step_4")
    r = ddp_run([f"resume={crashed}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_json(crashed / "summary.json")["resumed_from"].endswith("step_4")
    assert _losses(crashed) == _losses(clean)
    last = ck.latest(f"{clean}/checkpoints")
    if strategy == "fsdp":  # sharded: one DCP file per rank, and the last checkpoint's consolidated model
        step = Path(last)
        assert sorted(p.name for p in (step / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        model = torch.load(step / "model.pt", weights_only=True)
        assert model["tok.weight"].shape == (256, 64) and model["tok.weight"].dtype == torch.float32
        assert set(load_json(step / "meta.json")["files"]) >= {"model.pt", "shards/.metadata"}

    # step_12 of the 2-rank fp32 run (no dropout: one rank draws other masks than two) on one rank, same global
    # batch (accumulation 4): the same last losses.
    clean, args = strategy_run(strategy), _args(text_file, strategy)
    one = [a for a in args if not a.startswith(("world_size", "batch.accumulation"))] + [
        "world_size=1", "batch.global=8", f"resume={clean}/checkpoints/step_12"]
    single = _run(one, tmp_path / "one")
    assert load_json(single / "summary.json")["resumed_from"].endswith("step_12")
    a, b = _losses(single), _losses(clean)
    assert a[:12] == b[:12] and len(a) == 16
    for x, y in zip(a[12:], b[12:], strict=True):
        assert math.isclose(x, y, rel_tol=1e-3), (a, b)
