"""Shared helpers and fixtures of every tier.

- ``tests/unit/``: pure functions and objects, no subprocess, no process group.
- ``tests/integration/``: in-process gloo groups (threads, ``torch.multiprocessing``), Hydra's ``compose``, the CLI's
  ``main()`` called in this process (``cli_in_process``), helper subprocesses that are not the CLI, a real S3
  server on loopback.
- ``tests/e2e/``: the real CLI (``python -m ddp_runner``: Hydra → torchrun → gloo workers) in a subprocess.

Each item gets the marker of its tier (``-m unit``, ``-m "not e2e"``, …). Reference runs that several tests read
(never write) are made once per session, across xdist workers too (``shared_run``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.fake_smi import fake_smi  # noqa: F401 - fixtures for every tier
from tests.support.mlflow_server import mlflow_server  # noqa: F401 - fixtures for every tier
from tests.support.s3_server import s3_server, s3_url  # noqa: F401 - fixtures for every tier
from tests.support.tokenized import tokenized  # noqa: F401 - fixtures for every tier

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
T = TypeVar("T")
TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# -- xdist: tests that must share one worker (one resource per session) ------------------------------------------

# Files whose tests run on one xdist worker, one after the other (and beside the other workers' tests): the local
# Slurm of test_slurm.py is one cluster per session, started by its first test; the multi-node scenarios of
# test_multinode.py each run two drivers and wait on them with deadlines, which two such scenarios at once on a
# 2-core machine have missed. (pytest-xdist's own
# `xdist_group` marker, kept on that module too, does not group under pytest 9: its loadgroup scheduler reads a
# suffix that xdist 3.8 can no longer add to the node ids. The scheduler below groups by file path instead, and
# honours such a suffix where one is there.)
SERIAL_FILES = {"tests/e2e/test_slurm.py": "slurm", "tests/e2e/test_multinode.py": "multinode",
                "tests/e2e/test_kubernetes.py": "kubernetes"}

if importlib.util.find_spec("xdist") is not None:
    def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's hook
        """``--dist loadgroup``: each test is a work unit of its own (as ``--dist load``), except the tests of a
        SERIAL_FILES file or of an ``@group`` node id, which are one unit for one worker."""
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class GroupScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                if "@" in nodeid:
                    return nodeid.rsplit("@", 1)[-1]
                return SERIAL_FILES.get(nodeid.split("::", 1)[0], nodeid)

        return GroupScheduling(config, log)


def ddp_run(args: list[str], root: Path | str, timeout: float = 240, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``python -m ddp_runner <args> output.root=<root>`` as a user would type it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], cwd=tempfile.gettempdir(),
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def cli_in_process(args: list[str], root: Path | str, monkeypatch: pytest.MonkeyPatch,
                   env: dict[str, str] | None = None, cwd: Path | str | None = None,
                   ) -> subprocess.CompletedProcess[str]:
    """``ddp-run <args> output.root=<root>`` through ``ddp_runner.cli.main()`` in this process: for refusals and dry
    runs, which end before anything is launched (a fraction of a second instead of a new interpreter). The exit
    code is main()'s ``SystemExit``; stdout and stderr are what it printed. Any other exception propagates (a
    traceback is a failure, as it would be on a user's console). ``cwd``: where it runs (default: the temp dir)."""
    from ddp_runner import cli

    monkeypatch.setattr(cli, "_run", cli._Invocation())  # what one ddp-run process carries across its jobs
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["ddp-run", *args, f"output.root={root}"])
    monkeypatch.chdir(cwd or tempfile.gettempdir())
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(sys.argv, code if isinstance(code, int) else 1, out.getvalue(),
                                       err.getvalue())



def rank0_sleeps(seconds: float) -> list[str]:
    """Overrides that keep a run up without its ranks training flat out while a test watches it: rank 0 sleeps
    ``seconds`` after every step from step 1 on (the rehearsal ``slow`` fault) and the others wait for it in the
    next collective. A stop reaches a rank in that sleep or that wait as it would in a step."""
    return ["fault.kind=slow", "fault.rank=0", "fault.step=1", f"fault.slow_s={seconds}"]


def run_dirs(root: Path) -> list[Path]:
    """Every run directory (one holding config.yaml) under an output root."""
    return sorted(p.parent for p in root.rglob("config.yaml"))


def wait_for(what: str, probe: Callable[[], T], timeout: float = 120, interval: float = 0.1,
             driver: subprocess.Popen | None = None) -> T:
    """Poll ``probe`` until it returns something truthy, and return that (processes starting up, files
    appearing: not a timing assertion). With ``driver``, fail at once, with its output, when it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        if driver is not None and driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended (rc {driver.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    """A fresh output root (not created yet: the driver makes it)."""
    return tmp_path / "outputs"


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~5 KB of text: with context 64 and 4 samples per rank, 8 optimizer steps per epoch on 2 ranks."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "ranks", "gloo", "torch", "step", "epoch", "loss", "the", "a"]
    # One path for every xdist worker: a shared reference run (gpt_dropout_reference) records its data.path, and
    # a resume from its checkpoint by another worker must name the same file.
    from filelock import FileLock

    path = _shared_base(tmp_path_factory) / "data" / "small.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):  # written once: a run reading it never sees it replaced
        if not path.exists():
            path.write_text(" ".join(rng.choice(words) for _ in range(1200))[:5000])
    return path


# -- reference runs made once per session, shared by every xdist worker ------------------------------------------


def _shared_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session sees (xdist gives each worker a basetemp of its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """The run directory ``make(root)`` leaves under a fresh output root, made by whichever worker asks first;
    the others wait for it (a file lock) and get the same directory. Tests must only read it."""
    from filelock import FileLock

    base = _shared_base(tmp_path_factory) / f"shared-{name}"
    record = base.with_suffix(".json")
    with FileLock(str(base) + ".lock"):
        if record.exists():
            return Path(load_json(record)["run"])
        run = make(base / "outputs")
        record.write_text(json.dumps({"run": str(run)}))
        return run


# Two gloo ranks of the smoke task, a checkpoint every 2 of its 8 steps: the uninterrupted run that the recovery
# tests (test_resume, test_resume_fallback_e2e, test_remote, test_lease_e2e) compare against.
SMOKE_CKPT2 = ["task=smoke", "device=cpu", "world_size=2", "checkpoint.every_steps=2"]


@pytest.fixture(scope="session")
def smoke_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def make(root: Path) -> Path:
        r = ddp_run(SMOKE_CKPT2, root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        assert load_json(run / "summary.json")["steps"] == 8
        return run

    return shared_run(tmp_path_factory, "smoke-ckpt2", make)


# The tiny GPT at one global batch (24) on 1, 2, 3 and 4 gloo ranks: one `-m` sweep, 12 steps, a synchronous
# checkpoint every 2. test_world_sizes.py (nothing assumes two ranks; a 3-rank kill resumes to its job's losses),
# test_equivalence.py (every world size reaches the same weights) and test_compare_e2e.py (the report over a
# fixed-global-batch sweep) read it. Validation on a sliver of the
# default corpus (its 10 % tail is ~19k windows: seconds per validation on a CPU).
GPT_WORLD_SWEEP = ["task=gpt", "device=cpu", "train.max_steps=12", "train.log_every=2", "batch.per_rank=2",
                   "batch.global=24", "data.val_fraction=0.002", "checkpoint.every_steps=2",
                   "checkpoint.async_save=false"]


@pytest.fixture(scope="session")
def gpt_world_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep directory of :data:`GPT_WORLD_SWEEP` at world_size=1,2,3,4; the sweep's console output is in
    ``console.txt`` beside it."""
    def make(root: Path) -> Path:
        r = ddp_run(["-m", "world_size=1,2,3,4", *GPT_WORLD_SWEEP], root, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        (sweep,) = {p.parent for p in run_dirs(root)}
        (sweep.parent / "console.txt").write_text(r.stdout)
        return sweep

    return shared_run(tmp_path_factory, "gpt-world-sweep", make)


def gpt_dropout_args(text_file: Path) -> list[str]:
    """The tiny GPT on ``text_file`` at 2 gloo ranks: 8 optimizer steps per epoch, 2 epochs (16 steps), a
    checkpoint every 4 (all kept). AdamW, cosine schedule with warmup, grad clipping: all of it must carry over
    through a checkpoint. Dropout: the model draws random numbers at every training step, so a resume is exact only
    if it restores each rank's RNG. Synchronous saves: a kill 3 steps after a save must find that save complete
    (with async_save the save can still be in flight when torchrun stops rank 0, and the resume then rightly starts
    from the one before). A logging window per step, no validation: the throughput figures are per step."""
    return ["task=gpt", "device=cpu", "world_size=2", f"data.path={text_file}", "batch.per_rank=4",
            "task.model.dropout=0.1", "train.max_steps=null", "train.epochs=2", "train.log_every=1",
            "train.val_every=0", "checkpoint.every_steps=4", "checkpoint.keep_last=0", "checkpoint.async_save=false",
            "seed=3"]


GPT_DROPOUT_STEPS = 16


@pytest.fixture(scope="session")
def gpt_dropout_reference(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """One uninterrupted run of :func:`gpt_dropout_args` (test_resume.py, test_guards_e2e.py read it)."""
    return _uninterrupted_gpt_run(tmp_path_factory, "gpt-dropout", gpt_dropout_args(text_file))


def _uninterrupted_gpt_run(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str]) -> Path:
    """The shared run ``name`` of ``args``: completed, all GPT_DROPOUT_STEPS steps."""
    def make(root: Path) -> Path:
        r = ddp_run(args, root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        assert load_json(run / "summary.json")["steps"] == GPT_DROPOUT_STEPS
        return run

    return shared_run(tmp_path_factory, name, make)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``cli(args, root, env=None)``: :func:`cli_in_process` with this test's monkeypatch."""
    yield lambda args, root, env=None: cli_in_process(args, root, monkeypatch, env)


# --- shared runs (merge helper) ---

# SMOKE_CKPT2 with rank 1 SIGKILLed after step 7: a failed run that holds step_4 and step_6 (keep_last 2). The tests
# that continue it (test_resume.py, test_resume_fallback_e2e.py) each continue a copy of their own (copy_run).
KILL_SMOKE = ["fault.kind=sigkill", "fault.rank=1", "fault.step=7"]


@pytest.fixture(scope="session")
def smoke_crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of SMOKE_CKPT2 + KILL_SMOKE (made once per session; tests read it or copy it; its console:
    :func:`shared_console`, which test_diagnostics_e2e.py reads for the SIGKILLed rank's attribution)."""
    def make(root: Path) -> Path:
        run = _launch_shared(root, [*SMOKE_CKPT2, *KILL_SMOKE], ok=False)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        assert load_json(run / "run.json")["status"] == "failed"
        return run

    return shared_run(tmp_path_factory, "smoke-crashed", make)


def copy_run(run: Path, root: Path) -> Path:
    """A copy of the run directory ``run`` under the output root ``root`` (its ``<date>/<name>`` kept): a shared
    run that a test may continue, damage or prune without touching the one other tests read."""
    import shutil

    dest = root / run.parent.name / run.name
    shutil.copytree(run, dest)
    return dest


def gpt_fsdp_args(text_file: Path) -> list[str]:
    """:func:`gpt_dropout_args` under ``strategy=fsdp`` in bf16 (the mixed-precision policy too)."""
    return [*gpt_dropout_args(text_file), "strategy=fsdp", "train.precision=bf16"]


@pytest.fixture(scope="session")
def gpt_fsdp_reference(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """One uninterrupted run of :func:`gpt_fsdp_args` (test_stops.py's SIGINT under fsdp and test_strategies.py's
    SIGKILL under fsdp resume to it)."""
    return _uninterrupted_gpt_run(tmp_path_factory, "gpt-fsdp-bf16", gpt_fsdp_args(text_file))


# Files whose tests share a module-scoped launched run: on one worker, so that the run is made once (split over two
# workers, each made its own: test_hardening_e2e.py's SIGHUP run was launched twice in a measured session). And
# test_remote.py's run lives on its worker's own S3 server.
SERIAL_FILES.update({"tests/e2e/test_remote.py": "remote", "tests/e2e/test_hardening_e2e.py": "hardening",
                     "tests/e2e/test_secrets_e2e.py": "secrets"})


# --- shared runs (merge2 helper) ---
# Launches several test files read instead of each making its own (each ddp-run launch costs ~10 CPU-seconds of
# torch imports before it trains). Tests only read them.

# The tiny GPT on 2 gloo ranks for 30 optimizer steps under accumulation 2 (4 per rank × 2 ranks × 2 = 16), a
# validation every 10 steps, and torch.profiler asked for 5 steps after step 28 (training ends inside that window:
# steps 29 and 30 are traced). test_gpt.py (every scalar per optimizer step, the console, the x-axis under
# accumulation), test_goodput_global.py (goodput is global) and test_profiling_e2e.py (a trace cut short by the
# end of training) read it.
GPT_W2_STEPS = 30
GPT_W2 = ["task=gpt", "world_size=2", "device=cpu", "checkpoint.async_save=false", f"train.max_steps={GPT_W2_STEPS}",
          "train.val_every=10", "data.val_fraction=0.01", "batch.per_rank=4", "batch.accumulation=2",
          "train.profile.steps=5", "train.profile.start=28"]


def _console_of(run: Path) -> Path:
    """Where a shared run's fixture keeps what the launch printed (beside the run directory, not in it)."""
    return run.parent / f"{run.name}.console.json"


def shared_console(run: Path) -> dict:
    """A shared run's launch as seen from outside: ``stdout``, ``stderr``, ``rc`` and ``outside_s`` (seconds)."""
    return load_json(_console_of(run))


def _launch_shared(root: Path, args: list[str], ok: bool = True, env: dict[str, str] | None = None) -> Path:
    t0 = time.monotonic()
    r = ddp_run(args, root, env=env)
    outside_s = time.monotonic() - t0
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(root)
    _console_of(run).write_text(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode,
                                            "outside_s": outside_s}))
    return run


@pytest.fixture(scope="session")
def gpt_w2_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :data:`GPT_W2` (its console: :func:`shared_console`)."""
    return shared_run(tmp_path_factory, "gpt-w2", lambda root: _launch_shared(root, GPT_W2))


# The tiny GPT on 2 gloo ranks from a local uint16 token file (ids up to 319, a fixed cycle of 300: the next token
# is predictable), in bf16 autocast, 20 steps, with torch.profiler tracing steps 3 and 4. test_gpt.py (uint16 data,
# bf16 on CPU) and test_profiling_e2e.py (a full traced window) read it.
GPT_BIN_VOCAB, GPT_BIN_PERIOD, GPT_BIN_STEPS = 320, 300, 20


def gpt_bin_args(path: Path) -> list[str]:
    return ["task=gpt", "world_size=2", "device=cpu", "checkpoint.async_save=false", f"data.path={path}",
            f"task.model.vocab={GPT_BIN_VOCAB}", f"train.max_steps={GPT_BIN_STEPS}", "train.lr=3e-3",
            "data.val_fraction=0.05", "train.precision=bf16", "train.profile.steps=2", "train.profile.start=2"]


@pytest.fixture(scope="session")
def gpt_bin_bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :func:`gpt_bin_args` on a 120k-token file (~1.7k windows of 64 + 1)."""
    import numpy as np

    def make(root: Path) -> Path:
        path = root.parent / "tokens.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.tile(np.arange(GPT_BIN_PERIOD, dtype="<u2"), 400).tofile(path)
        return _launch_shared(root, gpt_bin_args(path))

    return shared_run(tmp_path_factory, "gpt-bin-bf16", make)


# The tiny GPT of GPT_WORLD_SWEEP on 2 ranks, another learning rate, rank 1 raising at step 3 (a rehearsal fault),
# under a 5 s hang watchdog and a 90 s collective timeout: test_compare_e2e.py (a failed run in the report beside
# the sweep) and test_diagnostics_e2e.py (an exception attributed to its rank and class) read it.
GPT_FAILED = [*GPT_WORLD_SWEEP, "world_size=2", "train.lr=0.002", "fault.kind=exception", "fault.rank=1",
              "fault.step=3", "watchdog.timeout_s=5", "timeout_s=90"]


@pytest.fixture(scope="session")
def gpt_failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :data:`GPT_FAILED` (its console: :func:`shared_console`), alone under its root."""
    return shared_run(tmp_path_factory, "gpt-failed", lambda root: _launch_shared(root, GPT_FAILED, ok=False))


# A dry run of a 1-rank, 2-step smoke plan (the CLI's main() in process), then the command it printed typed as
# printed into a shell (the console script beside this interpreter, else the one on PATH): test_dry_run_e2e.py
# checks that the launch was that plan; test_cli.py re-runs the run directory from its own config.
SMOKE_W1_DRY = ["task=smoke", "device=cpu", "world_size=1", "train.max_steps=2", "dry_run=true"]
DRY_RUN_SAYS = "ddp-run: dry run, nothing launched. To launch this plan, run:"


@pytest.fixture(scope="session")
def smoke_w1_typed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory the printed command made, alone under its root; :func:`shared_console` holds the shell's
    output and ``dry`` (the dry run's stdout, stderr and rc), ``printed`` (the command) and ``exe``."""
    import shlex
    import shutil

    def make(root: Path) -> Path:
        with pytest.MonkeyPatch.context() as mp:
            dry = cli_in_process(SMOKE_W1_DRY, root, mp)
        lines = dry.stdout.splitlines()
        printed = lines[lines.index(DRY_RUN_SAYS) + 1].strip() if DRY_RUN_SAYS in lines else ""
        here = Path(sys.executable).parent / "ddp-run"
        exe = str(here) if here.exists() else shutil.which("ddp-run")
        record = {"dry": {"stdout": dry.stdout, "stderr": dry.stderr, "rc": dry.returncode}, "printed": printed,
                  "exe": exe}
        assert dry.returncode == 0 and printed and exe, record
        r = subprocess.run(shlex.join([exe]) + printed.removeprefix("ddp-run"), shell=True, cwd=tempfile.gettempdir(),
                           env=os.environ, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        _console_of(run).write_text(json.dumps({**record, "stdout": r.stdout, "stderr": r.stderr,
                                                "rc": r.returncode}))
        return run

    return shared_run(tmp_path_factory, "smoke-w1-typed", make)


# One sequential smoke sweep on 1 and 2 ranks at a global batch of 24 (which 2 ranks of 8 cannot make: those two
# jobs are refused), two learning rates, 3 steps each: test_compare_e2e.py (a sweep records every job, a refused
# one too) and test_sweep_parallel.py (its 1-rank jobs are the sequential twins of the concurrent Optuna trials).
SMOKE_LR_SWEEP = ["task=smoke", "device=cpu", "batch.global=24", "train.max_steps=3", "sweep.objective=final_loss"]
SMOKE_LR_SWEEP_LRS = ("0.01", "0.05")


@pytest.fixture(scope="session")
def smoke_lr_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep directory; ``<sweep>.console.json`` beside it: the launch's ``stdout``, ``stderr``, ``rc`` and
    ``cwd_multirun_yaml`` (the mtime of a multirun.yaml in the launch's working directory, before and after)."""
    def make(root: Path) -> Path:
        cwd_record = Path(tempfile.gettempdir(), "multirun.yaml")  # ddp_run's working directory
        before = cwd_record.stat().st_mtime_ns if cwd_record.exists() else None
        r = ddp_run(["-m", "world_size=1,2", f"train.lr={','.join(SMOKE_LR_SWEEP_LRS)}", *SMOKE_LR_SWEEP], root,
                    timeout=400)
        after = cwd_record.stat().st_mtime_ns if cwd_record.exists() else None
        [sweep] = list(root.glob("*/*_sweep"))
        _console_of(sweep).write_text(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode,
                                                  "cwd_multirun_yaml": [before, after]}))
        return sweep

    return shared_run(tmp_path_factory, "smoke-lr-sweep", make)


# --- shared runs (cutB helper) ---
# Failed runs that a recovery test and a diagnostics test both need: one launch each instead of two. Tests only
# read them (a test that continues one continues a copy: copy_run). Their consoles: shared_console.

# SMOKE_CKPT2 with asynchronous saves, rank 0's background write of step_4 held for 8 s (a wide margin on a busy
# machine) and rank 1 out of memory at step 5 (the rehearsal OOM, an exception on CPU): rank 0 goes on into step 6's
# collective, which fails, and finishes the write on its way out. test_resume.py (the checkpoint in flight is
# finished) and test_diagnostics_e2e.py (an OOM attributed to its rank and class) read it.
SMOKE_OOM_IN_FLIGHT = [*SMOKE_CKPT2, "checkpoint.async_save=true", "fault.kind=oom", "fault.rank=1", "fault.step=5"]
SLOW_SAVE_STEP4 = {"DDP_RUNNER_SLOW_SAVE": "4:8"}


@pytest.fixture(scope="session")
def smoke_oom_in_flight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of :data:`SMOKE_OOM_IN_FLIGHT` under :data:`SLOW_SAVE_STEP4`, alone under its root."""
    def make(root: Path) -> Path:
        run = _launch_shared(root, SMOKE_OOM_IN_FLIGHT, ok=False, env=SLOW_SAVE_STEP4)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        return run

    return shared_run(tmp_path_factory, "smoke-oom-in-flight", make)


# The tiny GPT of GPT_WORLD_SWEEP on 2 ranks under strategy=zero1 in fp32, every checkpoint kept (test_strategies.py's
# recipe), rank 0 SIGKILLed after step 7 (the newest complete checkpoint: step_6). test_strategies.py (a copy of it
# resumed in place is bit-identical to the uninterrupted zero1 run) and test_diagnostics_e2e.py (a SIGKILLed rank 0
# is named, not rank 1 that it left waiting) read it.
GPT_ZERO1 = [*GPT_WORLD_SWEEP, "world_size=2", "checkpoint.keep_last=0", "strategy=zero1"]
GPT_ZERO1_KILL0 = [*GPT_ZERO1, "train.precision=fp32", "fault.kind=sigkill", "fault.rank=0", "fault.step=7"]


@pytest.fixture(scope="session")
def gpt_zero1_crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of :data:`GPT_ZERO1_KILL0`, alone under its root."""
    def make(root: Path) -> Path:
        run = _launch_shared(root, GPT_ZERO1_KILL0, ok=False)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        assert load_json(run / "run.json")["status"] == "failed"
        return run

    return shared_run(tmp_path_factory, "gpt-zero1-kill0", make)


@pytest.fixture(scope="module")
def gloo_group() -> Iterator[None]:
    """A one-process gloo group: the real DDP wrapper and collectives, as a rank sees them."""
    import torch.distributed as dist

    from tests.support.ports import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
