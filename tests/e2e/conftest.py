"""The shared runs only the e2e tier reads: each launched once per session, by whichever xdist worker asks first
(``tests/support/shared_runs.py``); their recipes are in ``tests/support/recipes.py``. Tests only read them (a
test that continues one continues a copy: ``copy_run``)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.driver import cli_in_process, ddp_run
from tests.support.recipes import (
    DRY_RUN_SAYS,
    GPT_BIN_PERIOD,
    GPT_FAILED,
    GPT_W2,
    GPT_WORLD_SWEEP,
    GPT_ZERO1_KILL0,
    KILL_SMOKE,
    SLOW_SAVE_STEP4,
    SMOKE_CKPT2,
    SMOKE_LR_SWEEP,
    SMOKE_LR_SWEEP_LRS,
    SMOKE_OOM_IN_FLIGHT,
    SMOKE_W1_DRY,
    gpt_bin_args,
    gpt_fsdp_args,
)
from tests.support.run_tree import load_json, run_dirs
from tests.support.shared_runs import (
    keep_console,
    launch_shared,
    shared_console,
    shared_run,
    uninterrupted_gpt_run,
)


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


@pytest.fixture(scope="session")
def smoke_crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of SMOKE_CKPT2 + KILL_SMOKE (made once per session; tests read it or copy it; its console:
    :func:`shared_console`, which test_diagnostics_e2e.py reads for the SIGKILLed rank's attribution)."""
    def make(root: Path) -> Path:
        run = launch_shared(root, [*SMOKE_CKPT2, *KILL_SMOKE], ok=False)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        assert load_json(run / "run.json")["status"] == "failed"
        return run

    return shared_run(tmp_path_factory, "smoke-crashed", make)


@pytest.fixture(scope="session")
def gpt_fsdp_reference(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """One uninterrupted run of :func:`gpt_fsdp_args` (test_stops.py's SIGINT under fsdp and test_strategies.py's
    SIGKILL under fsdp resume to it)."""
    return uninterrupted_gpt_run(tmp_path_factory, "gpt-fsdp-bf16", gpt_fsdp_args(text_file))


@pytest.fixture(scope="session")
def gpt_w2_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :data:`GPT_W2` (its console: :func:`shared_console`)."""
    return shared_run(tmp_path_factory, "gpt-w2", lambda root: launch_shared(root, GPT_W2))


@pytest.fixture(scope="session")
def gpt_bin_bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :func:`gpt_bin_args` on a 120k-token file (~1.7k windows of 64 + 1)."""
    import numpy as np

    def make(root: Path) -> Path:
        path = root.parent / "tokens.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.tile(np.arange(GPT_BIN_PERIOD, dtype="<u2"), 400).tofile(path)
        return launch_shared(root, gpt_bin_args(path))

    return shared_run(tmp_path_factory, "gpt-bin-bf16", make)


@pytest.fixture(scope="session")
def gpt_failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :data:`GPT_FAILED` (its console: :func:`shared_console`), alone under its root."""
    return shared_run(tmp_path_factory, "gpt-failed", lambda root: launch_shared(root, GPT_FAILED, ok=False))


@pytest.fixture(scope="session")
def smoke_w1_typed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory the printed command made, alone under its root; :func:`shared_console` holds the shell's
    output and ``dry`` (the dry run's stdout, stderr and rc), ``printed`` (the command) and ``exe``."""
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
        keep_console(run, {**record, "stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode})
        return run

    return shared_run(tmp_path_factory, "smoke-w1-typed", make)


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
        keep_console(sweep, {"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode,
                             "cwd_multirun_yaml": [before, after]})
        return sweep

    return shared_run(tmp_path_factory, "smoke-lr-sweep", make)


@pytest.fixture(scope="session")
def smoke_oom_in_flight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of :data:`SMOKE_OOM_IN_FLIGHT` under :data:`SLOW_SAVE_STEP4`, alone under its root."""
    def make(root: Path) -> Path:
        run = launch_shared(root, SMOKE_OOM_IN_FLIGHT, ok=False, env=SLOW_SAVE_STEP4)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        return run

    return shared_run(tmp_path_factory, "smoke-oom-in-flight", make)


@pytest.fixture(scope="session")
def gpt_zero1_crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The failed run of :data:`GPT_ZERO1_KILL0`, alone under its root."""
    def make(root: Path) -> Path:
        run = launch_shared(root, GPT_ZERO1_KILL0, ok=False)
        console = shared_console(run)
        assert console["rc"] != 0, console["stdout"] + console["stderr"]
        assert load_json(run / "run.json")["status"] == "failed"
        return run

    return shared_run(tmp_path_factory, "gpt-zero1-kill0", make)
