"""Where training stands: the progress a checkpoint saves and a resume restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where training stands: enough to continue exactly from here."""

    step: int = 0            # optimizer steps done
    epoch: int = 0           # current epoch
    micro_in_epoch: int = 0  # micro-batches of the current epoch already consumed
    losses: list[float] = field(default_factory=list)
    # Each rank's sum of the micro-step losses of the logging window still open, and the step it started after
    # (None: the current step; nothing open).
    window_loss: list[float] = field(default_factory=list)
    logged_step: int | None = None

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``progress`` entry."""
        return {"step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch,
                "losses": list(self.losses), "window_loss": list(self.window_loss), "logged_step": self.logged_step}
