"""Fixtures and hooks of every tier; the helpers that they use and that tests import are in ``tests/support/``.

- ``tests/unit/``: pure functions and objects, no subprocess, no process group.
- ``tests/integration/``: in-process gloo groups (threads, ``torch.multiprocessing``), Hydra's ``compose``, the CLI's
  ``main()`` called in this process (``cli_in_process``), helper subprocesses that are not the CLI, a real S3
  server on loopback.
- ``tests/e2e/``: the real CLI (``python -m ddp_runner``: Hydra → torchrun → gloo workers) in a subprocess.

Each item gets the marker of its tier (``-m unit``, ``-m "not e2e"``, …). Reference runs that several tests read
(never write) are made once per session, across xdist workers too (``tests/support/shared_runs.py``): those that
more than the e2e tier reads are here, the others in ``tests/e2e/conftest.py``.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.driver import cli_in_process, ddp_run
from tests.support.fake_smi import fake_smi  # noqa: F401 - fixtures for every tier
from tests.support.mlflow_server import mlflow_server  # noqa: F401 - fixtures for every tier
from tests.support.recipes import SMOKE_CKPT2, gpt_dropout_args
from tests.support.run_tree import load_json, run_dirs
from tests.support.s3_server import s3_server, s3_url  # noqa: F401 - fixtures for every tier
from tests.support.shared_runs import shared_base, shared_run, uninterrupted_gpt_run
from tests.support.tokenized import tokenized  # noqa: F401 - fixtures for every tier

TESTS = Path(__file__).resolve().parent
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
# 2-core machine have missed. Files whose tests share a module-scoped launched run: on one worker, so that the run
# is made once (split over two workers, each made its own: test_hardening_e2e.py's SIGHUP run was launched twice in
# a measured session). And test_remote.py's run lives on its worker's own S3 server. (pytest-xdist's own
# `xdist_group` marker, kept on that module too, does not group under pytest 9: its loadgroup scheduler reads a
# suffix that xdist 3.8 can no longer add to the node ids. The scheduler below groups by file path instead, and
# honours such a suffix where one is there.)
SERIAL_FILES = {"tests/e2e/test_slurm.py": "slurm", "tests/e2e/test_multinode.py": "multinode",
                "tests/e2e/test_kubernetes.py": "kubernetes", "tests/e2e/test_remote.py": "remote",
                "tests/e2e/test_hardening_e2e.py": "hardening", "tests/e2e/test_secrets_e2e.py": "secrets"}

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


# -- fixtures of every tier ---------------------------------------------------------------------------------------


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    """A fresh output root (not created yet: the driver makes it)."""
    return tmp_path / "outputs"


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``cli(args, root, env=None)``: :func:`cli_in_process` with this test's monkeypatch."""
    yield lambda args, root, env=None: cli_in_process(args, root, monkeypatch, env)


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~5 KB of text: with context 64 and 4 samples per rank, 8 optimizer steps per epoch on 2 ranks."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "ranks", "gloo", "torch", "step", "epoch", "loss", "the", "a"]
    # One path for every xdist worker: a shared reference run (gpt_dropout_reference) records its data.path, and
    # a resume from its checkpoint by another worker must name the same file.
    from filelock import FileLock

    path = shared_base(tmp_path_factory) / "data" / "small.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):  # written once: a run reading it never sees it replaced
        if not path.exists():
            path.write_text(" ".join(rng.choice(words) for _ in range(1200))[:5000])
    return path


# -- reference runs made once per session, shared by every xdist worker ------------------------------------------


@pytest.fixture(scope="session")
def smoke_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run of :data:`SMOKE_CKPT2` (8 steps, a checkpoint every 2)."""
    def make(root: Path) -> Path:
        r = ddp_run(SMOKE_CKPT2, root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        assert load_json(run / "summary.json")["steps"] == 8
        return run

    return shared_run(tmp_path_factory, "smoke-ckpt2", make)


@pytest.fixture(scope="session")
def gpt_dropout_reference(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """One uninterrupted run of :func:`gpt_dropout_args` (test_resume.py, test_guards_e2e.py read it)."""
    return uninterrupted_gpt_run(tmp_path_factory, "gpt-dropout", gpt_dropout_args(text_file))
