"""The launcher seam: what every launcher (``conf/launcher/<name>.yaml``) answers, and the job it is handed.

A launcher checks its own config before anything starts, says the torchrun command and the variables its workers
need, opens (or joins) the run directory, and launches into it. :class:`BaseLauncher` is one host's way
(``launcher=local``): a new run directory, or the continued one, and torchrun under the one supervision session
(``runner/supervise/session.py``). ``multinode`` and ``slurm`` change only what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ddp_runner.config.plan import Plan
from ddp_runner.console import sweep_view
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise import finalize
from ddp_runner.supervise.session import Session, environment


@dataclass
class Job:
    """One planned job, as the launcher gets it: the resolved config the workers run, its plan, and how to make
    its run directory. ``rd`` is set when the job continues an existing run directory (``resume=<run dir>``)."""

    conf: dict[str, Any]
    plan: Plan
    t0: float
    task_dir: str | None = None
    rd: RunDir | None = None
    new_run_dir: Callable[[], RunDir] | None = None
    staged: dict[str, tuple[int, int]] = field(default_factory=dict)
    # A sweep's job under a launcher that queues (Slurm): submitted as (run dir, job id) into this list, not
    # followed; the sweep follows all its jobs together (runner/launch/slurm_sweep.py). None: follow it here.
    submitted: list[tuple[RunDir, str]] | None = None
    written: dict[str, Any] | None = None  # the config as config.yaml records it (secrets masked)

    @property
    def launcher(self) -> Mapping[str, Any]:
        """The ``launcher`` config group of this job."""
        return self.conf["launcher"]

    @property
    def continuing(self) -> bool:
        """Does this job continue a run directory that exists already?"""
        return self.rd is not None


class Launcher(Protocol):
    """What the job layer asks of a launcher; the registry (``runner/launch/registry.py``) maps names to them."""

    name: str

    def check(self, launcher: Mapping[str, Any], output_root: str) -> None:
        """Refuse (PlanError) a launcher config this launcher cannot run, before anything starts."""
        ...

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """The torchrun invocation for ``plan`` into ``run_url`` (the worker entry is ``python -P -m
        ddp_runner.tasks``)."""
        ...

    def env(self, launcher: Mapping[str, Any]) -> dict[str, str]:
        """Variables this launcher's workers need (each added only where the user has not set it)."""
        ...

    def open(self, job: Job) -> RunDir | None:
        """The run directory this driver writes: made, or continued; None when this driver joins one that
        another driver opens (another node of a multi-node run)."""
        ...

    def join(self, job: Job) -> int:
        """Run this node's part of a run another driver opened; its exit code."""
        ...

    def launch(self, job: Job, rd: RunDir, manifest: dict[str, Any]) -> int:
        """Launch into the opened run directory, supervise to the end, finalise; the job's exit code."""
        ...


class BaseLauncher:
    """One host: torchrun's agent with a c10d rendezvous, supervised in this driver."""

    name = "base"

    def check(self, launcher: Mapping[str, Any], output_root: str) -> None:
        """Nothing beyond the plan's own checks."""

    def command(self, plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
        """Every launcher names its own command."""
        raise NotImplementedError

    def env(self, launcher: Mapping[str, Any]) -> dict[str, str]:
        """No variables of its own."""
        return {}

    def open(self, job: Job) -> RunDir | None:
        """The continued run directory, or a new one."""
        if job.rd is not None:
            return job.rd
        assert job.new_run_dir is not None
        return job.new_run_dir()

    def join(self, job: Job) -> int:
        """Only a multi-node launcher has runs opened by another driver."""
        raise NotImplementedError(f"launcher={self.name} never joins a run another driver opened")

    def session(self, job: Job, rd: RunDir, cmd: list[str], manifest: dict[str, Any] | None, **kwargs: Any
                ) -> Session:
        """The supervision session of this job's torchrun."""
        env = environment(rd, job.conf, job.plan, job.t0, job.task_dir, self.env(job.launcher))
        return Session(rd, job.conf, job.plan, cmd, env, manifest=manifest, **kwargs)

    def launch(self, job: Job, rd: RunDir, manifest: dict[str, Any]) -> int:
        """torchrun under supervision, then the summary."""
        session = self.session(job, rd, manifest["command"], manifest, staged=job.staged)
        rc = session.run()
        if session.lease_lost:  # another driver owns the directory now: its run.json is its own
            return 1
        code = finalize.finish(rd, manifest, job.plan, rc, session.interrupted, watch=session.observations(),
                                preempt=session.preempt)
        session.close()
        if not sweep_view.in_turn((manifest.get("invocation") or {}).get("sweep"), job.conf):  # its job line has it
            print(rd.url, flush=True)  # whole, last: for scripts (textfit: a path alone on its line)
        return code
