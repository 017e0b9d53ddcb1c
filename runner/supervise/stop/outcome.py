"""What a stop did to a run, read from its ranks' records after torchrun ends (pure: runner/supervise/finalize.py
prints and records it).

- A stop the ranks agreed on (every rank's facts say ``stopped``): the run ends ``interrupted`` (``preempted``) with
  the checkpoint of the step they stopped after. After the last optimizer step that checkpoint is the final one,
  and what the stop cut short is the final validation: ``resume=<run dir>`` runs only that (docs/resume.md).
- A stop that a lost peer node caused (its driver's death took its torchrun agent down with SIGTERM, which its ranks
  took as the stop; this driver was sent no signal): the run ends ``preempted`` (the cluster took a node away; the
  checkpoint was saved, so it never counts as a failure), and the headline names the lost node, not a signal.
- A stop that reached the ranks after their work was done (final checkpoint committed, final validation run: every
  rank completed, none stopped) cut nothing: the run is ``completed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import command_line


def came_after_the_end(facts: Mapping[int, Mapping[str, Any]], check: Mapping[str, Any], world_size: int) -> bool:
    """Did every rank finish its work (it reports completion, and no stop) although a stop was sent? Then the stop
    came after the final checkpoint and validation, and cut nothing."""
    ranks = [facts.get(r) or {} for r in range(world_size)]
    return bool(check.get("all_completed")) and all(f.get("completed") and not f.get("stopped") for f in ranks)


def cut_nothing(stopped: Mapping[str, Any] | None, interrupted: int | None, facts: Mapping[int, Mapping[str, Any]],
                check: Mapping[str, Any], world_size: int) -> bool:
    """Was the driver stopped (``interrupted``: its signal) although no rank stopped, every one having finished
    its work (:func:`came_after_the_end`)? Then the run is completed."""
    return stopped is None and interrupted is not None and came_after_the_end(facts, check, world_size)


def stopped_line(status: str, signal_name: str, stopped: Mapping[str, Any]) -> str:
    """The console's line for a stop the ranks agreed on: the signal, the step, and what it cut short."""
    return (f"ddp-run: {status.upper()} by {signal_name}: every rank stopped after step {stopped['step']}"
            f"{_where(stopped)}")


def _where(stopped: Mapping[str, Any]) -> str:
    """``, the last, during validation``: what the stop's step was and what it cut short."""
    where = ", the last" if stopped.get("last_step") else ""
    if stopped.get("during"):
        where += f", during {stopped['during']}"
    return where


def lost_peer_line(status: str, cause: str, stopped: Mapping[str, Any]) -> str:
    """The console's line for a stop a lost peer node caused (``cause``: runner/launch/node_story.py's
    ``stop_cause``): what happened, the step every rank stopped after, and that this driver was sent no signal."""
    return (f"ddp-run: {status.upper()}: {cause}; every rank stopped after step {stopped['step']}{_where(stopped)}"
            " (this node's driver was sent no signal)")


def continue_lines(url: str, status: str, stopped: Mapping[str, Any]) -> list[str]:
    """What was saved, and the one command that continues the run (after the last step: that validates it)."""
    saved = f"ddp-run: {status}: checkpoint {stopped['checkpoint']} committed, nothing lost"
    if stopped.get("last_step"):
        return [f"{saved}; training is done but its final validation did not run. Run it (no step is left) with:",
                f"  {command_line.resume(url)}"]
    return [f"{saved}. Continue it with:", f"  {command_line.resume(url)}"]


def after_the_end_line(signal_name: str) -> str:
    """The console's line for a stop that cut nothing (:func:`came_after_the_end`)."""
    return (f"ddp-run: {signal_name} came after the last step, the final checkpoint and the final validation: nothing"
            " was cut short")
