"""The dry run's answer: the command that launches its plan, and exactly what ``ddp-run`` then starts, as one line a
shell runs: ``env`` with the variables ddp-run gives torchrun and its workers (the run directory's among them),
then torchrun's own command line. ``$RUN_DIR`` stands for the run directory, which only a launch creates; where it
is unset, the shell refuses the line with one message before anything starts (``${RUN_DIR:?…}``)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.console import textfit
from ddp_runner.contract import layout, secrets

RUN_DIR = "$RUN_DIR"  # the stand-in for the run directory
# The first $RUN_DIR of the line, as the shell checks it: unset or empty, the line stops here with this message.
RUN_DIR_CHECK = "${RUN_DIR:?set RUN_DIR to a run directory ddp-run made, holding config.yaml and run.json}"
# Variables of a launch that only time it (the worker uses its own clock without them).
_TIMING = (layout.ENV_T0, layout.ENV_LAUNCH_T)


def launch_argv(argv: list[str]) -> list[str]:
    """The dry run's command line without ``dry_run=true``: what launches the plan it printed."""
    return [a for a in argv if a.lstrip("+").split("=", 1)[0] != "dry_run"]


def shell_word(word: str) -> str:
    """``word`` for a POSIX shell, with ``$RUN_DIR`` left for the shell to expand (and nothing else)."""
    if RUN_DIR not in word:
        return shlex.quote(word)
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return '"' + escaped.replace("\\" + RUN_DIR, RUN_DIR) + '"'


def shell_line(cmd: Sequence[str], env: Mapping[str, str]) -> str:
    """``env K=V … cmd …`` as one shell line (just ``cmd`` without variables); the first ``$RUN_DIR`` is checked,
    so that a line pasted without RUN_DIR set is refused by the shell, not by every rank."""
    return " ".join(shell_words(cmd, env))


def shell_words(cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """:func:`shell_line`'s words, each quoted for the shell."""
    words = [shell_word(w) for w in ([*(["env"] if env else []), *(f"{k}={v}" for k, v in env.items()), *cmd])]
    first = next((i for i, w in enumerate(words) if RUN_DIR in w), None)
    if first is not None:
        words[first] = words[first].replace(RUN_DIR, RUN_DIR_CHECK, 1)
    return words


def launch_variables(conf: Mapping[str, Any], plan: Plan, launcher: Any, task_dir: str | None) -> dict[str, str]:
    """The variables ddp-run sets for torchrun and its workers that this shell does not already have: the run
    directory's names (as ``$RUN_DIR``), the launcher's, the diagnostics' (runner/supervise/session.py)."""
    from types import SimpleNamespace

    from ddp_runner.supervise.session import environment

    rd: Any = SimpleNamespace(url=RUN_DIR, local=RUN_DIR)
    env = environment(rd, conf, plan, 0.0, task_dir, launcher.env(conf["launcher"]))
    first = (layout.ENV_RUN_DIR, layout.ENV_LOCAL_DIR)  # the run directory's names lead the line
    return {k: env[k] for k in sorted(env, key=lambda k: (k not in first, first.index(k) if k in first else 0, k))
            if os.environ.get(k) != env[k] and k not in _TIMING}


def print_dry_run(argv: list[str], masks: Sequence[str], cmd: list[str], launcher: str,
                  env: Mapping[str, str]) -> None:
    """What to type to launch this plan (a sweep: the whole sweep), and exactly what ddp-run then starts: with
    ``env`` (:func:`launch_variables`), except under Slurm, whose job script sets them on every node."""
    what = "this sweep" if {"-m", "--multirun"} & set(argv) else "this plan"
    slurm = launcher == "slurm"
    starts = ("submits an sbatch job (RUN_DIR/slurm/job.sbatch) whose nodes run" if slurm
              else "starts, with the environment it gives torchrun")
    width = textfit.terminal_width(sys.stdout)
    launch = [secrets.redact(shlex.quote(w), list(masks)) for w in launch_argv(argv)]
    started = [secrets.redact(w, list(masks)) for w in shell_words(cmd, {} if slurm else env)]
    print("\n".join([*textfit.fit_lines(f"ddp-run: dry run, nothing launched. To launch {what}, run:", width),
                     *textfit.command(launch, width),
                     *textfit.fit_lines("ddp-run then creates the run directory (RUN_DIR below), writes config.yaml"
                                        f" and run.json into it, and {starts}:", width),
                     *textfit.command(started, width)]), flush=True)
