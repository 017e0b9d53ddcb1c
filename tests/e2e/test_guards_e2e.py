"""End-to-end guards (real CLI, torchrun, gloo on CPU) against bugs that comparing two runs of the same code
cannot see: each run here is checked against an independent reference (hand-computed SGD, an uninterrupted run
with dropout, the plan's global batch, the driver's stop deadline).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_runner.contract import layout
from ddp_runner.supervise.supervisor import GRACE_S
from ddp_runner.tasks.engine import checkpoint as ckpt
from ddp_runner.tasks.smoke import Regression, synthetic_dataset
from tests.support.driver import ddp_run
from tests.support.recipes import GPT_DROPOUT_STEPS, rank0_sleeps
from tests.support.run_tree import load_json, run_dirs
from tests.support.waiting import wait_for

T = TypeVar("T")


def _sweep(root: Path, *args: str) -> list[Path]:
    """``ddp-run -m <args>`` (one launch, one job per swept value): every job completed; their run directories."""
    r = ddp_run(["-m", "device=cpu", "checkpoint.async_save=false", *args], root)
    assert r.returncode == 0, r.stdout + r.stderr
    return run_dirs(root)


def _model_at(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"step_{step}" / "state.pt", map_location="cpu", weights_only=True)["model"]


# -- 2. the loss is divided by the accumulation count (SGD sees the gradient's scale) ---------------------------

# 3 epochs of 2 steps: two epoch boundaries, so set_epoch's reshuffle is covered too.
SGD_SEED, SGD_LR, SGD_EPOCHS, GLOBAL, PER_RANK, SMOKE_N = 5, 0.1, 3, 32, 8, 64


def _sgd_by_hand() -> dict[str, torch.Tensor]:
    """The smoke task's SGD, one full global batch of 32 at a time, in plain PyTorch.

    The engine seeds ``seed`` before building the task (the synthetic data has its own generator, so the model's
    init is the first draw); optimizer step k of epoch e takes samples P_e[32k : 32k+32], where P_e is torch's
    DistributedSampler permutation for (seed, e) (rank r of W takes P_e[r::W], so the union over ranks and
    micro-steps of one step is exactly that slice). The step's gradient is that of the mean loss over the 32.
    """
    torch.manual_seed(SGD_SEED)
    data = synthetic_dataset(SMOKE_N, 8, 1, seed=7)  # data.seed: the synthetic config's own
    model = Regression(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    x, y = data.tensors
    for epoch in range(SGD_EPOCHS):
        sampler = DistributedSampler(range(SMOKE_N), num_replicas=1, rank=0, shuffle=True, seed=SGD_SEED)
        sampler.set_epoch(epoch)
        order = list(sampler)
        for k in range(SMOKE_N // GLOBAL):
            idx = order[k * GLOBAL:(k + 1) * GLOBAL]
            opt.zero_grad()
            model(x[idx], y[idx]).backward()
            opt.step()
    return model.state_dict()


def test_sgd_one_rank_times_four_equals_two_ranks_times_two_and_by_hand(tmp_path: Path) -> None:
    """Guards against the micro-step loss not being divided by ``batch.accumulation``: the existing equivalence
    tests use AdamW (scale-invariant) with clipping. With plain SGD the gradient's scale is the step's size:
    undivided, 1 rank × 4 micro-steps steps 4× too far and 2 ranks × 2 micro-steps 2× too far.

    Also the fixed-global-batch equivalence of world size 1 (accumulation 4) and 2 (accumulation 2) on the smoke
    task across two epoch boundaries (AdamW's: tests/e2e/test_equivalence.py, on the tiny GPT)."""
    common = ["task=smoke", f"seed={SGD_SEED}", f"batch.global={GLOBAL}", f"batch.per_rank={PER_RANK}",
              "train.optimizer=sgd", f"train.lr={SGD_LR}", "train.momentum=0.0", "train.weight_decay=0.0",
              "train.grad_clip=null", "train.schedule=constant", "train.warmup_steps=0", f"train.epochs={SGD_EPOCHS}",
              f"data.num_samples={SMOKE_N}"]
    steps = SGD_EPOCHS * SMOKE_N // GLOBAL
    # Both world sizes as the two jobs of one sweep (one launch: the driver's start-up is paid once).
    jobs = _sweep(tmp_path, *common, "world_size=1,2")
    runs = {load_json(run / "run.json")["plan"]["world_size"]: run for run in jobs}
    assert sorted(runs) == [1, 2]
    for w, acc in ((1, 4), (2, 2)):
        assert load_json(runs[w] / "run.json")["plan"]["accumulation"] == acc
        assert ckpt.load(str(runs[w] / "checkpoints" / f"step_{steps}"))["plan"]["accumulation"] == acc
        assert load_json(runs[w] / "summary.json")["steps"] == steps
    one, two, hand = _model_at(runs[1], steps), _model_at(runs[2], steps), _sgd_by_hand()
    torch.manual_seed(SGD_SEED)
    init = Regression(8, 1).state_dict()
    assert one.keys() == two.keys() == hand.keys()
    for k in hand:
        assert (hand[k] - init[k]).abs().max() > 1e-2, f"{k}: SGD moved it (the comparison is meaningful)"
        # fp32: only the summation order differs (micro-batch sums, the all-reduce).
        torch.testing.assert_close(one[k], hand[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"1×4 {k}: {m}")
        torch.testing.assert_close(two[k], hand[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"2×2 {k}: {m}")
        torch.testing.assert_close(one[k], two[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"1×4 vs 2×2 {k}: {m}")


# -- 3. a resume restores every rank's RNG (dropout draws after start-up): tests/e2e/test_resume.py ---------------
#        ::test_kill_then_resume_run_dir_is_bit_identical resumes the tiny GPT with dropout, bit for bit.
# -- 4. samples/s and tokens/s are global (× world size), from the recorded figures ----------------------------

# The uninterrupted tiny-GPT run of recipes.gpt_dropout_args: context 64, 4 per rank on 2 ranks, 16 steps.
GPT_STEPS, GPT_CONTEXT = GPT_DROPOUT_STEPS, 64


@pytest.fixture
def gpt_clean(gpt_dropout_reference: Path) -> Path:
    return gpt_dropout_reference


def test_recorded_throughput_times_step_time_is_the_global_batch(gpt_clean: Path) -> None:
    """Guards against samples/s and tokens/s counted per rank instead of globally (off by the world size): the
    other end-to-end test re-derives them with the engine's own formula. Here the recorded figures must satisfy
    rate × step time = the plan's global batch (in samples, and × context in tokens), window by window."""
    plan, summary = load_json(gpt_clean / "run.json")["plan"], load_json(gpt_clean / "summary.json")
    world, batch = plan["world_size"], plan["global_batch"]
    assert world == 2 and batch == 4 * 2  # per rank × ranks × accumulation 1
    tokens = batch * GPT_CONTEXT
    final = summary["final"]
    assert final["perf/samples_per_s"] * final["perf/step_time_s"] == pytest.approx(batch, rel=1e-9)
    assert final["perf/tokens_per_s"] * final["perf/step_time_s"] == pytest.approx(tokens, rel=1e-9)
    assert final["perf/tokens_per_s_per_device"] * world * final["perf/step_time_s"] == pytest.approx(tokens,
                                                                                                     rel=1e-9)
    windows = summary["perf_windows"]
    assert len(windows["step_time_s"]) == len(windows["tokens_per_s"]) == GPT_STEPS - 1  # all but the first
    for tps, step_s in zip(windows["tokens_per_s"], windows["step_time_s"], strict=True):
        assert tps * step_s == pytest.approx(tokens, rel=1e-9)
    # An odd number of windows: each median is one window's value, and rate = tokens / step time is monotone.
    median = summary["median"]
    assert median["tokens_per_s"] * median["step_time_s"] == pytest.approx(tokens, rel=1e-9)


# -- 5. the driver stops torchrun fast, and reaps what outlives it ----------------------------------------------


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children()
    except psutil.Error:
        return []


def _ranks_under(torchrun: psutil.Process) -> list[psutil.Process]:
    """The ranks: forks of torchrun's server, named ``ddp-rank<R>`` (their DataLoader workers, their own forks,
    carry the name too)."""
    found = []
    for p in _children(torchrun):
        for q in _children(p):
            try:
                if q.name().startswith("ddp-rank"):
                    found.append(q)
            except psutil.Error:
                continue
    return found


def _exactly(n: int, procs: list[psutil.Process]) -> list[psutil.Process] | None:
    return procs if len(procs) == n else None


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


# While a test looks at the run (processes, fact files) before it acts, both ranks go on stepping, slowly.
IDLE = rank0_sleeps(0.2)


@dataclass
class Launch:
    """A driver on a long smoke run, its torchrun child and the two ranks (once both train)."""

    driver: subprocess.Popen[bytes]
    torchrun: psutil.Process
    ranks: list[psutil.Process]


@pytest.fixture
def launch(out_root: Path, tmp_path: Path) -> Iterator[tuple[Callable[..., Launch], list[psutil.Process]]]:
    """``start(*overrides)`` runs ``python -m ddp_runner`` on a long smoke run and returns once both ranks train.

    The driver's output goes to files, not pipes: a leftover worker holding a pipe open must not be mistaken for
    a driver that has not exited.

    Afterwards every process of the tree it started (and any the test added to the tracked list) that is still
    alive is SIGKILLed by pid, so a failing test leaks nothing into the next one.
    """
    tracked: list[psutil.Process] = []
    drivers: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Launch:
        with open(tmp_path / "driver.out", "wb") as out, open(tmp_path / "driver.err", "wb") as err:
            driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "task=smoke", "world_size=2", "device=cpu",
                                       "train.max_steps=1000000", "train.log_every=1000", *IDLE, *args,
                                       f"output.root={out_root}"], stdout=out, stderr=err,
                                      env={**os.environ, **(env or {})})
        drivers.append(driver)
        wait_for("both ranks' fact files", lambda: len(list(out_root.rglob("logs/rank*.json"))) == 2)
        me = psutil.Process(driver.pid)
        [torchrun] = wait_for("torchrun, the driver's child", lambda: _exactly(1, _children(me)))
        ranks = wait_for("two ranks, forks of torchrun's server", lambda: _exactly(2, _ranks_under(torchrun)))
        tracked.extend([torchrun, *_children(torchrun), *ranks])
        return Launch(driver, torchrun, ranks)

    try:
        yield start, tracked
    finally:
        for p in _alive(tracked):
            p.kill()
        for d in drivers:
            if d.poll() is None:
                d.kill()
            d.wait()


def _procs_mentioning(text: str) -> list[psutil.Process]:
    """Processes whose command line names ``text`` (torchrun) or that work for that run directory (the ranks)."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if any(text in part for part in (p.info["cmdline"] or [])) or \
                    text in (p.info["environ"] or {}).get("DDP_RUNNER_RUN_DIR", ""):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_is_forwarded_so_the_run_stops_well_inside_the_grace(launch, out_root, tmp_path, sig) -> None:
    """Guards against the driver not forwarding SIGTERM to torchrun (``Supervisor._on_signal``): the driver
    SIGKILLs torchrun after GRACE_S (20 s) and the workers die with it. Forwarded, torchrun stops its workers at
    once and ends by itself. Ctrl-C (SIGINT) takes the same way. The driver says so, exits 128 + the signal, leaves
    no process of the run, and the run reads as interrupted.

    Which of the two happened is read from run.json (torchrun's exit code: -9 only where the driver killed it at
    the end of the grace), not from the clock: on a loaded machine the orderly stop itself can take seconds more,
    and a bound on it would fail a good build."""
    start, _ = launch
    run = start()
    [run_dir] = run_dirs(out_root)
    assert len(list(run_dir.glob("logs/rank*.json"))) == 2, "both ranks started"
    assert len(_procs_mentioning(str(run_dir))) >= 3  # torchrun + 2 workers
    hang_guard = GRACE_S + 60  # past the grace either way: only a driver that never ends reaches it
    t0 = time.monotonic()
    run.driver.send_signal(sig)
    try:
        run.driver.wait(timeout=hang_guard)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver still runs {hang_guard:.0f} s after signal {int(sig)}")
    elapsed = time.monotonic() - t0
    manifest = load_json(run_dir / "run.json")
    assert manifest["torchrun_exit_code"] != -signal.SIGKILL, \
        f"torchrun was killed at the end of the grace ({elapsed:.1f} s): it was not told to stop"
    assert run.driver.returncode == 128 + sig
    assert _alive([run.torchrun, *run.ranks]) == [], "no worker outlives the driver"
    assert f"ddp-run: stopping on {sig.name}" in (tmp_path / "driver.err").read_text()
    # What the stop killed leaves the process table in a moment (a busy machine's moment is longer); what the
    # driver left running stays.
    deadline = time.monotonic() + 30
    while (left := _procs_mentioning(str(run_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
    assert manifest["status"] == "interrupted"
    assert load_json(run_dir / "summary.json")["status"] == "interrupted"
    print(f"stopped {elapsed:.1f} s after signal {int(sig)} (torchrun exit code {manifest['torchrun_exit_code']})")


def _driver_ticks(run_dir: Path, n: int) -> None:
    """Wait until the driver has refreshed its heartbeat in run.json ``n`` times from now (with
    ``DDP_RUNNER_HEARTBEAT_S`` below its 0.5 s tick: once a tick). A tick records torchrun's descendants, then
    refreshes the heartbeat: of ``n`` ticks seen, the last ``n - 1`` began after this call."""
    def beat() -> float | None:
        try:
            return (load_json(run_dir / "run.json").get("driver") or {}).get("heartbeat")
        except (OSError, ValueError):  # being replaced
            return None

    seen = [beat()]

    def ticked() -> bool:
        if (b := beat()) is not None and b != seen[-1]:
            seen.append(b)
        return len(seen) > n

    wait_for(f"{n} ticks of the driver", ticked, interval=0.05)


def test_workers_left_behind_by_a_killed_torchrun_are_reaped(launch, out_root) -> None:
    """Guards against the driver's reaper finding or ending nothing (``Supervisor._snapshot``/``_reap``): ranks die
    with torchrun (PR_SET_PDEATHSIG), but their own children do not. Each rank's DataLoader worker is frozen
    (SIGSTOP: it cannot notice its parent's death and exit by itself), then torchrun is SIGKILLed: the driver
    must end the frozen orphans (SIGTERM, then SIGKILL after 5 s) before it exits."""
    start, tracked = launch
    # A heartbeat in run.json at every tick of the driver's supervision loop, which also records torchrun's
    # descendants: the test reads from it that the driver has looked since the loaders exist.
    run = start("train.num_workers=1", env={layout.ENV_HEARTBEAT_S: "0.01"})
    loaders = wait_for("each rank's DataLoader worker",
                        lambda: _exactly(2, [q for r in run.ranks for q in _children(r)]), interval=0.2)
    tracked.extend(loaders)
    for p in loaders:
        p.suspend()
    [run_dir] = run_dirs(out_root)
    _driver_ticks(run_dir, 2)  # a tick that began after the loaders existed has recorded them
    t0 = time.monotonic()
    run.torchrun.kill()
    bound = 120.0  # not a measure: a hang guard (the reaper's 5 s wait after SIGTERM, the summary, a busy machine)
    try:
        run.driver.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver still runs {bound:.0f} s after torchrun died")
    elapsed = time.monotonic() - t0
    assert run.driver.returncode != 0
    left = _alive([*run.ranks, *loaders])
    assert left == [], f"left behind after torchrun died: {[(p.pid, p.status()) for p in left]}"
    print(f"driver and workers gone {elapsed:.1f} s after torchrun was killed (bound {bound:.0f} s)")
