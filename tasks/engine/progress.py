"""Rank 0's progress on the console: a tqdm bar on a terminal, a few plain lines otherwise."""

from __future__ import annotations

from typing import IO


class Progress:
    """Shows optimizer steps, loss and throughput. Writes nothing when there is no console."""

    def __init__(self, console: IO[str] | None, total: int, start: int = 0) -> None:
        self.console, self.total, self.last_line = console, total, start
        self.bar = None
        if console is not None and console.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, file=console, unit="step", dynamic_ncols=True)
        self.every = max(1, total // 10)

    def update(self, step: int, loss: float, rate: float) -> None:
        """Report that ``step`` optimizer steps are done."""
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.4f}", rate=f"{rate:,.0f}/s", refresh=False)
        elif self.console is not None and (step - self.last_line >= self.every or step == self.total):
            self.last_line = step
            self.console.write(f"  step {step}/{self.total}  loss {loss:.4f}  {rate:,.0f}/s\n")
            self.console.flush()

    def close(self) -> None:
        """End the bar."""
        if self.bar is not None:
            self.bar.close()
