"""What ``ddp-run`` answers without running anything: ``--help`` (the reference of runner/config/reference.py,
with the values this command line composes), Hydra's ``--info`` made to work after the runner's own overrides,
and, after Hydra's ``--cfg job``, the values the runner derives from the composed config."""

from __future__ import annotations

import shlex

from ddp_runner.config import overrides as ov
from ddp_runner.config import reference
from ddp_runner.config.reference import INFO_CHOICES, compose_values, conf_dirs, without_info
from ddp_runner.contract.rules import global_batch


def print_help(args: list[str], config_path: str) -> None:
    """``ddp-run --help [overrides]``."""
    cli = ov.parse(without_info(args))
    values = compose_values(args, config_path)
    print(reference.help_text(conf_dirs(cli.config_dir, config_path), values))
    if not values:
        print(f"\n(The config of {' '.join(without_info(args))} cannot be composed, so no values are shown: run it"
              " without --help to see why.)")


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
    if fixed is not None and isinstance(ws, int) and isinstance(per_rank, int) and isinstance(fixed, int):
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
