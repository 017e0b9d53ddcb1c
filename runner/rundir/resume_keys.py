"""What may change when a run resumes, and what may not: one table, checked before launch and rendered into
docs/resume.md (a test keeps the page in step with it).

A checkpoint restores the model, the optimizer's state and its learning-rate schedule, the data position and every
rank's RNG. A setting that lives in that state cannot change on resume: a changed ``train.lr`` would be overwritten
by the scheduler's restored state, and the record would claim a value that was never used. Such a change is
refused before launch, naming the keys. Every other setting is applied from the step the run resumes at, and
run.json records it (``resume_changes``: the checkpoint's value, the value used, from which step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import secrets
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten

# (key or section, why it cannot change). Every key not matched here may change on resume.
FIXED: tuple[tuple[str, str], ...] = (
    ("task", "the checkpoint's weights fit only the model (and task) they were trained as"),
    ("train.optimizer", "the optimizer's state (moments, momentum buffers) belongs to that optimizer"),
    ("train.lr", "the learning rate comes from the restored schedule state"),
    ("train.schedule", "the restored schedule state continues the checkpoint's schedule"),
    ("train.warmup_steps", "part of the restored schedule"),
    ("train.min_lr_ratio", "part of the restored schedule"),
    ("train.weight_decay", "restored with the optimizer's parameter groups"),
    ("train.betas", "restored with the optimizer's parameter groups"),
    ("train.momentum", "restored with the optimizer's parameter groups"),
    ("seed", "the data order and every rank's RNG continue from the checkpoint"),
    ("data", "the data position continues in the checkpoint's data (except data.val_path)"),
    ("strategy.name", "the checkpoint's layout (fsdp's shards, or ddp's and zero1's single file) belongs to its"
     " strategy: ddp and zero1 may swap, fsdp and the others may not"),
)
# Fixed keys that may change between some values all the same: (old, new) -> is it a change the checkpoint fixes?
_ONLY_WHEN: dict[str, Any] = {"strategy.name": lambda old, new: (old == "fsdp") != (new == "fsdp")}
# Keys under a FIXED section that may change all the same.
FREE_UNDER_FIXED = ("data.val_path",)
# What may change, said in words for the docs table (the keys are everything else).
FREE_NOTES: tuple[tuple[str, str], ...] = (
    ("world_size, batch.per_rank, batch.accumulation", "at the same global batch (another global batch is another "
     "optimisation problem: refused)"),
    ("train.max_steps, train.epochs", "how long it trains from the checkpoint on"),
    ("train.grad_clip, train.precision, train.compile*, train.log_every, train.val_every", "applied from the "
     "step it resumes at"),
    ("checkpoint.*, output.*, launcher.*, device, backend, watchdog.*, timeout_s, debug", "applied from the step "
     "it resumes at"),
    ("any other key", "applied from the step it resumes at"),
)
# Never compared: how and where this launch runs, not what it trains.
_IGNORED = ("resume", "dry_run", "output.root", "fault")


def _under(key: str, section: str) -> bool:
    return key == section or key.startswith(section + ".")


def is_fixed(key: str) -> str | None:
    """Why ``key`` cannot change on resume (None: it may)."""
    if any(_under(key, k) for k in FREE_UNDER_FIXED):
        return None
    return next((why for section, why in FIXED if _under(key, section)), None)


def differences(theirs: Mapping[str, Any], mine: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (checkpoint's run value, this run's value)}`` for every key of this run whose value differs from the
    checkpoint's run's (credentials compared masked: config.yaml never holds them). A key only this run has (the
    checkpoint's run predates it) and one it dropped are no difference: the plan's own checks judge them."""
    a, b = flatten(theirs), flatten(mine)
    out = {}
    for key in sorted(b):  # a key the checkpoint's run lacks is newer than that run: nothing to compare it with
        if any(_under(key, k) for k in _IGNORED) or key in ("batch.accumulation", "world_size"):
            continue  # another world size at the same global batch: the plan's own rule decides
        if key not in a:
            continue
        x, y = a[key], b[key]
        if isinstance(x, str) and isinstance(y, str):
            x, y = secrets.redact_urls(x), secrets.redact_urls(y)
        if x != y and not (isinstance(x, (int, float)) and isinstance(y, (int, float)) and float(x) == float(y)):
            out[key] = (x, y)
    return out


def check(theirs: Mapping[str, Any], mine: Mapping[str, Any], source: str, step: int | None
          ) -> dict[str, dict[str, Any]]:
    """Refuse (PlanError) a resume that changes a key the checkpoint fixes; return the changes that apply, as
    run.json records them: ``{key: {"checkpoint": old, "used": new, "from_step": step}}``."""
    diff = differences(theirs, mine)
    fixed = {k: v for k, v in diff.items() if is_fixed(k) and (k not in _ONLY_WHEN or _ONLY_WHEN[k](*v))}
    if fixed:
        key, (old, new) = next(iter(fixed.items()))
        others = f" (and {', '.join(list(fixed)[1:])})" if len(fixed) > 1 else ""
        raise PlanError(key, new, f"differs from the checkpoint's run ({old!r}){others}, and cannot change on"
                        f" resume: {is_fixed(key)}",
                        f"resume with {key}={old} as the checkpoint's run had it, or start a new run from step 0"
                        " (resume=never); docs/resume.md lists what may change on resume")
    return {k: {"checkpoint": old, "used": new, "from_step": step} for k, (old, new) in diff.items()
            if k not in fixed}


def docs_table() -> str:
    """The table of docs/resume.md: what may not change on resume (and why), and what may."""
    lines = ["| key | on resume | why |", "| --- | --- | --- |"]
    lines += [f"| `{k}`{' (all of it)' if '.' not in k and k not in ('seed',) else ''} | refused before launch |"
              f" {why} |" for k, why in FIXED]
    lines += [f"| `{k}` | may change |  |" for k in FREE_UNDER_FIXED]
    lines += [f"| {', '.join(f'`{k.strip()}`' if k.strip() != 'any other key' else k.strip() for k in keys.split(','))}"
              f" | may change | {why} |" for keys, why in FREE_NOTES]
    return "\n".join(lines) + "\n"
