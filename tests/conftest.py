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
SERIAL_FILES = {"tests/e2e/test_slurm.py": "slurm", "tests/e2e/test_multinode.py": "multinode"}

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
    def make(root: Path) -> Path:
        r = ddp_run(gpt_dropout_args(text_file), root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        assert load_json(run / "summary.json")["steps"] == GPT_DROPOUT_STEPS
        return run

    return shared_run(tmp_path_factory, "gpt-dropout", make)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``cli(args, root, env=None)``: :func:`cli_in_process` with this test's monkeypatch."""
    yield lambda args, root, env=None: cli_in_process(args, root, monkeypatch, env)
