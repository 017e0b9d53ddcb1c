"""TensorBoard: event files in ``<run>/tb`` (written locally, mirrored for a remote run directory)."""

from __future__ import annotations

from typing import Any

from ddp_runner.tasks.engine.reporting import log_window as tb


class TensorBoard:
    """A ``SummaryWriter`` behind the tracker interface; the plan and settings go in as TEXT and HPARAMS."""

    name = "tensorboard"

    def __init__(self, logdir: str) -> None:
        self.writer = tb.open_writer(logdir)

    def start(self, plan: dict[str, int], hparams: dict[str, Any], tokens: bool, micro: bool = False) -> None:
        tb.write_plan(self.writer, plan, hparams, tokens=tokens, micro=micro)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def resume_at(self, step: int) -> None:
        tb.purge_from(self.writer, step + 1)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
