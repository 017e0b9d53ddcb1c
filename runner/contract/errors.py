"""The error every refusal raises, and the choice tuples both sides check values against.

Standard library only: the workers import it at start-up.
"""

from __future__ import annotations

from typing import Any

DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "nccl", "gloo")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "adamw")
DDP_COMM = ("fp32", "bf16")
SWEEP_DIRECTIONS = ("minimize", "maximize")  # sweep.direction: which way a sweep's objective is better
SCHEDULES = ("constant", "cosine")
COMPILE_SCOPES = ("model", "blocks")  # tasks/engine/strategy/ddp_compile.py
VAL_COMPILE = ("auto", "eager", "compiled")  # tasks/engine/val_compile.py


STRATEGIES = ("ddp", "zero1", "fsdp")  # tasks/engine/strategy/
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class PlanError(ValueError):
    """A refused plan: names the config key, the offending value and the fix."""

    def __init__(self, key: str, value: Any, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}. Fix: {fix}")
