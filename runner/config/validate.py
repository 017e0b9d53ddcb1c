"""Every key the engine reads, checked before launch from one declarative table.

Each :class:`Rule` says what one key may hold (type, range, choices, whether null is allowed); :func:`check_keys`
refuses the first value that breaks its rule with a :class:`~ddp_runner.config.plan.PlanError` naming the key, the value
and the fix. Rules that join several keys follow the table in :func:`check_engine`; :func:`warnings` says what
is allowed but likely not meant.
Tasks check their own keys through their ``task.checks`` hook, with the same :class:`Rule` and
:func:`check_keys` (see ``tasks/gpt/checks.py``).

A key absent from the config is not refused here: Hydra composes every key of ``conf/config.yaml``, and
``runner/config/overrides.py`` refuses removing one with ``~``. Pure: no I/O, standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import stops, tracking
from ddp_runner.contract.errors import (
    BACKENDS,
    COMPILE_MODES,
    COMPILE_SCOPES,
    DDP_COMM,
    DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
    STRATEGIES,
    SWEEP_DIRECTIONS,
    VAL_COMPILE,
    PlanError,
)
from ddp_runner.contract.rules import Rule, check_keys, choice, flag, get, integer, number, stop_signal, text

# Seeds feed torch, numpy and Python generators alike (seed + rank, seed + epoch): numpy takes 32 bits.
SEED_MAX = 2**32 - 1024

# checkpoint.export: the formats ddp-export writes (hf: the GPT task's models only).
EXPORT_FORMATS = ("safetensors", "hf")
GPT_MODULE = "ddp_runner.tasks.gpt.task"

# Every key of conf/config.yaml the driver or the engine reads, except those with rules of their own elsewhere
# (world_size's relation to devices and nodes and batch.global's divisibility: runner/config/plan.py; data.*:
# DATA_RULES below and runner/data/prep.py; train.inductor's names: runner/config/plan.py).
ENGINE_RULES: tuple[Rule, ...] = (
    integer("world_size", lo=1, also=("auto",), example="2"),
    integer("batch.per_rank", lo=1, also=("auto",), example="8"),
    integer("batch.accumulation", lo=1, example="1"),
    integer("batch.global", lo=1, null=True, example="32"),
    choice("device", DEVICES),
    choice("backend", BACKENDS),
    integer("seed", lo=0, hi=SEED_MAX, example="7"),
    integer("train.max_steps", lo=1, null=True, example="100"),
    integer("train.epochs", lo=1, null=True, example="2"),  # needed (plan.py) only without max_steps
    choice("train.optimizer", OPTIMIZERS),
    number("train.lr", lo=0, lo_open=True, example="3e-4"),
    number("train.weight_decay", lo=0, example="0.1"),
    Rule("train.betas", "numbers", lo=0, hi=1, hi_open=True, length=2, example="[0.9,0.95]"),
    number("train.momentum", lo=0, hi=1, hi_open=True, example="0.9"),
    number("train.grad_clip", lo=0, lo_open=True, null=True, example="1.0"),
    choice("train.schedule", SCHEDULES),
    integer("train.warmup_steps", lo=0, example="100"),
    number("train.min_lr_ratio", lo=0, hi=1, example="0.1"),
    choice("train.precision", PRECISIONS),
    flag("train.compile"),
    choice("train.compile_mode", COMPILE_MODES, null=True),
    choice("train.compile_scope", COMPILE_SCOPES, null=True),
    flag("train.compile_cache", null=True),
    flag("train.own_gpu", null=True),
    flag("train.deterministic", null=True),
    integer("train.timing_every", lo=0, null=True, example="1"),
    Rule("train.inductor", "mapping", null=True),
    number("train.ddp_bucket_mb", lo=0, lo_open=True, null=True, example="25"),
    choice("train.ddp_comm", DDP_COMM, null=True),
    flag("train.ddp_split_graph", null=True),
    integer("train.log_every", lo=1, example="10"),
    flag("train.gpu_telemetry", null=True),
    integer("train.val_every", lo=0, example="100"),
    integer("train.val_samples", lo=1, null=True, example="2048"),
    choice("train.val_compile", VAL_COMPILE, null=True),
    integer("train.num_workers", lo=0, example="2"),
    integer("train.profile.steps", lo=0, example="3"),
    integer("train.profile.start", lo=0, example="10"),
    integer("checkpoint.every_steps", lo=0, example="100"),
    integer("checkpoint.keep_last", lo=0, example="2"),  # 0 keeps them all
    flag("checkpoint.async_save"),
    flag("checkpoint.final", null=True),
    flag("checkpoint.on_stop", null=True),
    number("checkpoint.stop_grace_s", lo=1, hi=stops.MAX_GRACE_S, null=True, example="20"),
    stop_signal("checkpoint.stop_signal", example=f"{stops.DEFAULT_SIGNAL} (or SIGTERM; SIGUSR1 is NCCL's)"),
    choice("strategy.name", STRATEGIES),
    number("strategy.memory_cap_gb", lo=0, lo_open=True, null=True, example="80"),
    flag("strategy.reshard_after_forward", null=True),
    flag("strategy.accumulate_unsharded", null=True),
    text("resume", example="auto"),
    text("output.root", example="outputs"),
    flag("output.private"),
    flag("dry_run"),
    number("timeout_s", lo=0, lo_open=True, example="600"),
    integer("launcher.max_restarts", lo=0, example="0"),
    integer("launcher.last_call_s", lo=1, example="30"),
    integer("sweep.parallel", lo=1, also=("auto", False), example="auto"),
    integer("sweep.cores_per_rank", lo=1, example="2"),
    text("sweep.objective", example="val_loss"),
    choice("sweep.direction", SWEEP_DIRECTIONS),
    choice("checkpoint.export", EXPORT_FORMATS, null=True),
    text("logger.mlflow.tracking_uri", null=True, example="http://127.0.0.1:5000"),
    text("logger.mlflow.experiment", null=True, example="my-experiment"),
    choice("logger.mlflow.on_unreachable", tracking.ON_UNREACHABLE),
    text("logger.wandb.project", example="ddp-runner"),
    text("logger.wandb.entity", null=True, example="my-team"),
    choice("logger.wandb.mode", tracking.WANDB_MODES),
    choice("logger.wandb.on_unreachable", tracking.ON_UNREACHABLE),
)

# The data group's own keys, by ``data.name`` (file checks and data.format/val_fraction: runner/data/prep.py).
DATA_RULES: dict[str, tuple[Rule, ...]] = {
    "synthetic": (integer("data.num_samples", lo=1, example="64"), integer("data.seed", lo=0, hi=SEED_MAX,
                                                                           example="7")),
    "text": (text("data.path", null=True, example="data/train.bin"),
             text("data.val_path", null=True, example="data/val.bin"),
             integer("data.vocab", lo=1, hi=2**16, null=True, example="50257")),
}


def check_engine(cfg: Mapping[str, Any]) -> None:
    """The engine's keys (:data:`ENGINE_RULES`), then the rules that join several of them."""
    check_keys(cfg, ENGINE_RULES)
    if get(cfg, "train.compile_mode") is not None and get(cfg, "train.compile") is False:
        raise PlanError("train.compile_mode", get(cfg, "train.compile_mode"),
                        "has no effect: train.compile is false", "set train.compile=true, or train.compile_mode=null")
    if get(cfg, "checkpoint.export") == "hf" and get(cfg, "task.module") != GPT_MODULE:
        raise PlanError("checkpoint.export", "hf", "the Hugging Face format is written for the GPT task's models only",
                        "use checkpoint.export=safetensors (any task), or null")


def warnings(cfg: Mapping[str, Any]) -> list[str]:
    """What is allowed but likely not meant, for the console. (A warmup longer than a short run is how presets
    are benchmarked for a few steps, so it is said, not refused.)"""
    out = []
    max_steps, warmup = get(cfg, "train.max_steps"), get(cfg, "train.warmup_steps")
    if isinstance(max_steps, int) and isinstance(warmup, int) and warmup > max_steps:
        out.append(f"train.warmup_steps={warmup} is longer than the run (train.max_steps={max_steps}): the learning"
                   f" rate never reaches train.lr (it ends at {max_steps / warmup:.2g} of it)")
    return out


def check_data(data: Mapping[str, Any]) -> None:
    """The data group's keys for its ``data.name`` (an unknown name is the task's to refuse)."""
    check_keys({"data": data}, DATA_RULES.get(str(data.get("name")), ()))


def check_task_name(cfg: Mapping[str, Any]) -> None:
    """``task.name`` names the run directory (``<time>_<task.name>_w<N>``): a plain name, never a path."""
    task = cfg.get("task")
    name = task.get("name") if isinstance(task, Mapping) else None
    if name is None:
        return
    text_name = str(name)
    if not text_name or "/" in text_name or "\\" in text_name or text_name.startswith(".") or "\x00" in text_name:
        raise PlanError("task.name", name, "must be a plain name: it names the run directory, and a path in it"
                        " would put the run elsewhere", "use letters, digits, '-' and '_', e.g. task.name=mytask")


def check(cfg: Mapping[str, Any]) -> None:
    """Everything the driver checks from the config alone, before it looks at files, tasks or devices."""
    check_task_name(cfg)
    check_engine(cfg)
    if isinstance(cfg.get("data"), Mapping):
        check_data(cfg["data"])
