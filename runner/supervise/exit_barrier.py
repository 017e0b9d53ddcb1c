"""A torchrun agent stopped by a signal still arrives at the agents' exit barrier (several nodes).

torchrun's agents wait at an exit barrier, up to 300 s, until every agent's workers have ended. An agent stopped
by a signal (a Kubernetes pod preempted, SIGTERM or Ctrl-C to one node's ``ddp-run``) stops its workers, which
save the checkpoint every rank agreed on, and exits without arriving there. The other nodes' agents, whose workers
ended cleanly at the same step, then waited out the 300 s before their drivers could write the summary, and a
preempted pod's replacement found the run still open. Installed in the agent (``runner/launch/agent.py``), a
stopped agent arrives once its workers have ended, waiting at most :data:`STOPPED_BARRIER_S` for the others.
"""

from __future__ import annotations

from typing import Any

# A stopped agent's wait for the others: inside the driver's grace after a stop (checkpoint.stop_grace_s + 4 s).
STOPPED_BARRIER_S = 10.0


def arrive(agent: Any) -> None:
    """Take part in the exit barrier after a stop (its errors are logged by torchrun, never raised): the other
    agents wait for this one; nothing to do before the rendezvous has formed the group."""
    group = getattr(agent, "_worker_group", None)
    if getattr(agent, "_store", None) is None or group is None or not getattr(group, "group_world_size", None):
        return
    agent._exit_barrier_timeout = min(float(agent._exit_barrier_timeout), STOPPED_BARRIER_S)
    agent._exit_barrier()


def install() -> None:
    """Wrap torchrun's agent run: on its signal exception (the workers stopped), arrive, then raise it on."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException

    original = SimpleElasticAgent.run
    if getattr(original, "_arrives_when_stopped", False):
        return

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except SignalException:
            arrive(self)
            raise

    run._arrives_when_stopped = True  # type: ignore[attr-defined]
    SimpleElasticAgent.run = run  # type: ignore[method-assign]
