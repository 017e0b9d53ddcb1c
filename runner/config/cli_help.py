"""What ``ddp-run`` answers without running anything: ``--help`` (the reference of runner/config/reference.py,
with the values this command line composes; ``--help KEY|GROUP`` only those keys), Hydra's ``--info`` made to work
after the runner's own overrides, and, after Hydra's ``--cfg job``, the values the runner derives from the composed
config."""

from __future__ import annotations

import difflib
import shlex
import sys
from collections.abc import Callable
from typing import IO

from ddp_runner.config import overrides as ov
from ddp_runner.config import reference, task_module
from ddp_runner.config.reference import INFO_CHOICES, compose_values, conf_dirs, without_info
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import global_batch


def _print(text: str, stream: IO[str]) -> None:
    print(text, file=stream)


def print_help(args: list[str], config_path: str, say: Callable[[str, IO[str]], None] = _print) -> int:
    """``ddp-run --help [KEY|GROUP ...] [overrides]``: the whole reference, or only the keys and groups named
    (``train.lr``, ``train``), with the values the overrides compose. Returns the exit code: 2 when a name is
    neither a key nor a group. ``say(text, stream)`` prints (the CLI's fits the text to the terminal)."""
    names, args = asked(args)
    args = as_the_run_composes(args, config_path)
    cli = ov.parse(without_info(args))
    values = compose_values(args, config_path)
    dirs = conf_dirs(cli.config_dir, config_path)
    if names:
        text, unknown = reference.named_help(names, dirs, values)
        if unknown:
            near = difflib.get_close_matches(unknown[0], reference.known_names(dirs, values), n=3)
            say(f"ddp-run: --help {unknown[0]}: no key or group of that name"
                + (f" (did you mean {', '.join(near)}?)" if near else "")
                + "; ddp-run --help lists them all", sys.stderr)
            return 2
        say(text, sys.stdout)
    else:
        say(reference.help_text(dirs, values), sys.stdout)
    if not values:
        say(f"\n(The config of {' '.join(without_info(args))} cannot be composed, so no values are shown: run it"
            " without --help to see why.)", sys.stdout)
    return 0


def asked(args: list[str]) -> tuple[list[str], list[str]]:
    """The names ``--help`` is asked about (words that are no override: ``train.lr``, ``train``) and the rest of
    the command line."""
    words = [w for w in ov.parse(without_info(args)).overrides if "=" not in w and not w.startswith("~")]
    rest = list(args)
    for w in words:
        rest.remove(w)
    return words, rest


def as_the_run_composes(args: list[str], config_path: str) -> list[str]:
    """The command line as ``ddp-run`` composes it (runner/cli.py): ``task.module=x`` without ``task=`` (and
    without a primary config of the user's own) composes the custom preset, not the default task's."""
    cli = ov.parse(without_info(args))
    path = config_path
    if cli.config_dir is not None:
        try:
            _, path = ov.user_dir_first(without_info(args), cli.config_dir, cli.config_name, config_path)
        except PlanError:
            return args  # the help stays useful; the run itself says why
    if path == config_path and task_module.module_only(cli.overrides):
        return [*args, f"task={task_module.CUSTOM_PRESET}"]
    return args


def info_args(args: list[str]) -> list[str]:
    """``--info`` takes an optional choice: given none, the next word (an override, or the runner's own
    ``hydra.*`` settings appended after the user's arguments) would be taken for it. Spell out ``all``."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a in ("--info", "-i") and (i + 1 == len(args) or args[i + 1] not in INFO_CHOICES):
            out.append("all")
    return out


def derived(args: list[str], config_path: str) -> str:
    """After ``--cfg job``: what the runner derives from the composed config before launch, as YAML comments
    (so the output stays valid YAML)."""
    values = compose_values(args, config_path)
    if not values:
        return ""
    lines = ["", "# ddp-run derives these after composition (the run uses them, not the values above):"]
    per_rank, ws, fixed = values.get("batch.per_rank"), values.get("world_size"), values.get("batch.global")
    if ws == "auto":
        lines.append("#   world_size: one rank per visible GPU (nnodes × GPUs per node), decided at launch")
    if per_rank == "auto":
        lines.append("#   batch.per_rank: auto: the largest micro-batch that divides batch.global / world_size and fits"
                     " the device (the memory plan's estimate; halved on an out-of-memory error in the first steps);"
                     " batch.accumulation follows")
    elif fixed is not None and isinstance(ws, int) and isinstance(per_rank, int) and isinstance(fixed, int):
        if fixed % (per_rank * ws) == 0:
            acc = fixed // (per_rank * ws)
            lines.append(f"#   batch.accumulation: {acc}   (batch.global {fixed} / ({per_rank} per rank × {ws} ranks);"
                         f" global batch {global_batch(per_rank, ws, acc)})")
        else:
            lines.append(f"#   batch.accumulation: none: batch.global {fixed} is not divisible by {per_rank} per rank"
                         f" × {ws} ranks, so the run is refused")
    elif fixed is not None:
        lines.append("#   batch.accumulation: batch.global / (batch.per_rank × world_size), once world_size is known")
    device = values.get("device")
    if device == "auto":
        lines.append("#   device: cuda when a GPU is visible, else cpu")
    if values.get("backend") == "auto":
        lines.append("#   backend: " + {"cpu": "gloo", "cuda": "nccl"}.get(str(device), "nccl on cuda, gloo on cpu"))
    if len(lines) == 2:
        lines.append("#   nothing: every value above is used as it is")
    dry = shlex.join(["ddp-run", *without_info(args), "dry_run=true"])
    lines.append(f"# The whole plan, checked: {dry}")
    return "\n".join(lines)


def version() -> str:
    """This package's version (``ddp-run --version``)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("ddp-runner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"
