"""How a job was asked for (:class:`Invocation`) and how it ended (:class:`Outcome`), and a refusal's words."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.console import textfit
from ddp_runner.contract import layout, secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import run_dir as rundir


@dataclass
class Invocation:
    """How the job was asked for (from Hydra's record of it), so that it can be reproduced, and where a new run
    directory goes (a sweep's jobs go into the sweep's directory)."""

    argv: list[str]
    overrides: list[str] = field(default_factory=list)
    task_preset: str | None = None
    config_name: str | None = None
    config_sources: list[str] = field(default_factory=list)
    swept: dict[str, str] = field(default_factory=dict)
    new_run_dir: Callable[[dict[str, Any], Plan, datetime], rundir.RunDir] | None = None
    paths_given: dict[str, str] = field(default_factory=dict)  # data paths as typed, before made absolute
    # The sweep this job belongs to: {"id": the sweep directory's name, "dir": its URL, "job": the job number}
    # (None: not a sweep's job). Recorded in run.json (``invocation.sweep``), e.g. for a tracker's parent run.
    sweep: dict[str, Any] | None = None
    # A sweep's queued jobs (Slurm): each submitted job's (run dir, job id) is added here, and followed by the
    # sweep with the others (None: the launcher follows the job itself).
    submitted: list[Any] | None = None
    env_raw: dict[str, str] = field(default_factory=dict)  # keys set by ${oc.env:…}: their text, never their value
    masks: list[str] = field(default_factory=list)  # the secret strings nothing written or printed may hold
    real: dict[str, str] = field(default_factory=dict)  # {key: real value} of what config.yaml holds masked
    resume_changes: dict[str, Any] = field(default_factory=dict)  # settings changed on resume (run.json)

    def record(self, task_dir: str | None) -> dict[str, Any]:
        """``invocation`` in run.json."""
        return {"argv": self.argv, "cwd": os.getcwd(), "overrides": self.overrides, "task_preset": self.task_preset,
                "paths_given": self.paths_given,
                "config_name": self.config_name, "config_sources": self.config_sources, "task_dir": task_dir,
                # This job's value of each key the sweep varies (TensorBoard's HPARAMS table shows them).
                "swept": self.swept, "sweep": self.sweep}


@dataclass
class Outcome:
    """How a job ended: its exit code, its run directory (None when it got none) and a refusal's reason."""

    code: int
    run_dir: str | None = None
    reason: str | None = None

    @property
    def refused(self) -> bool:
        """Was the job refused before anything started?"""
        return self.code == layout.EXIT_REFUSED and self.run_dir is None


def refuse(err: PlanError, job: str | None = None) -> Outcome:
    """Print a refusal the user can act on (its secrets masked); the refused outcome, whose reason (recorded in a
    sweep's sweep.json and sweep.md) names the key, its value, the problem and the fix. ``job``: a sweep's job
    (``job 2 (lr=0.1)``), said in one line, so that a sweep's console keeps one line a job."""
    reason = f"refused: {err.key}={err.value!r}: {err.problem}"
    if job is not None:
        textfit.say(secrets.redact(f"ddp-run: {job} {reason}. Fix: {err.fix}", secrets.KNOWN), sys.stderr)
    else:
        textfit.say(secrets.redact(f"ddp-run: {reason}.\n"
                                   f"  key:   {err.key}\n  value: {err.value!r}\n  fix:   {err.fix}\n"
                                   "Nothing was started and no run directory was created.", secrets.KNOWN), sys.stderr)
    return Outcome(layout.EXIT_REFUSED, reason=secrets.redact(f"{reason}. Fix: {err.fix}", secrets.KNOWN))


def sweep_job(how: Invocation) -> str | None:
    """How a refusal names a sweep's job (``job 2``); None for a run of its own."""
    return f"job {how.sweep['job']}" if how.sweep and how.sweep.get("job") is not None else None
