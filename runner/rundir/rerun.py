"""The commands that run a recorded run again: from scratch as it was first asked for (``ddp-runs show``'s
``reproduce``), or from step 0 in a new run directory (a run with nothing to continue from). Built from run.json's
``invocation``, the command that started the run (a run continued in place keeps that one as
``first_invocation``: its own ``invocation`` is the continuing ``resume=<dir>``, refused once the run completed)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from ddp_runner.config.task_module import CUSTOM_PRESET
from ddp_runner.contract import command_line

# Options of ddp-run (Hydra's) that take the next word as their value.
_VALUE_OPTIONS = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")


def first_invocation(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """How the run was first asked for: run.json's ``first_invocation`` of a run continued in place, else its
    ``invocation``; None when a continued run's record lost it (it names only the command that continued it)."""
    first = manifest.get("first_invocation")
    if isinstance(first, dict):
        return first
    if manifest.get("continued"):
        return None
    return manifest.get("invocation") or {}


def reproduce_command(invocation: Mapping[str, Any], *extra: str, drop: tuple[str, ...] = ()) -> str | None:
    """The command that reruns a run from scratch: ddp-run's options from its command line (``--config-dir``…,
    not ``-m``) and this job's own overrides (less those of the keys ``drop``, then ``extra``), run from the
    directory it was started in; None when run.json records no invocation."""
    overrides, argv = invocation.get("overrides"), list(invocation.get("argv") or [])
    if not isinstance(overrides, list):
        return None
    options, it = [], iter(argv[1:])
    for word in it:
        if word in ("-m", "--multirun") or not word.startswith("-"):
            continue
        options.append(word)
        if word in _VALUE_OPTIONS:
            options.append(next(it, ""))
    given = [o for o in given_overrides(list(map(str, overrides)), argv) if _key(o) not in drop]
    cmd = command_line.ddp_run(*given, *extra, options=options)
    cwd = invocation.get("cwd")
    return f"cd {shlex.quote(cwd)} && {cmd}" if cwd else cmd


def given_overrides(overrides: list[str], argv: list[str]) -> list[str]:
    """The job's overrides in the form the user gave them: without the ``task=custom`` ddp-run adds when only
    ``task.module=`` names the task (runner/cli.py), which the same command adds again."""
    typed_task = any(_key(w) == "task" for w in argv[1:] if "=" in w)
    return [o for o in overrides if typed_task or o != f"task={CUSTOM_PRESET}"]


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]
