"""One interface for every tracker, and the fan-out rank 0 writes through.

A tracker takes a step's scalars at once (:meth:`Tracker.log`), is told where a resumed launch starts
(:meth:`Tracker.resume_at`), is flushed before a checkpoint (what a checkpoint covers has reached the tracker, so a
resume from it leaves no gap) and closed at the end. Only rank 0 opens trackers: one tracker run per job whatever the
world size; every rank's figures reach rank 0 through the log step's gather (tasks/engine/logging.py).

A tracker whose writes go over the network (MLflow, W&B online) is wrapped in :class:`Background`: the training loop
never waits on a request. A tracker that fails mid-run is never silent: rank 0's console and log say so once, it is
dropped, the others go on, and summary.json's ``trackers`` records the error.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol


class Tracker(Protocol):
    """What every tracker does (tensorboard.py, csv_log.py, mlflow_log.py, wandb_log.py)."""

    name: str

    def log(self, scalars: dict[str, float], step: int) -> None:
        """Record ``scalars`` at optimizer step ``step``."""

    def resume_at(self, step: int) -> None:
        """This launch continues after ``step``: points of an interrupted attempt past it are superseded."""

    def flush(self) -> None:
        """Everything logged so far is written."""

    def close(self) -> None:
        """Flush and release."""


class Background:
    """Runs a tracker's calls on one thread of its own, in order; :meth:`flush` waits for them."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self._q: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=f"tracker-{self.name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            fn, args = item
            try:
                if self.error is None:
                    fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the fan-out, on the training thread
                self.error = exc
            finally:
                self._q.task_done()
        self._q.task_done()

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._q.put((self.inner.log, (scalars, step)))

    def resume_at(self, step: int) -> None:
        self._q.put((self.inner.resume_at, (step,)))

    def flush(self) -> None:
        self._q.put((self.inner.flush, ()))
        self._q.join()

    def close(self) -> None:
        self._q.put((self.inner.close, ()))
        self._q.put(None)
        self._thread.join()


class Trackers:
    """Rank 0's trackers as one: every call goes to each; one that fails is reported once and dropped."""

    def __init__(self, trackers: list[Any], console: IO[str] | None = None) -> None:
        self.trackers = trackers
        self.console = console
        self.errors: dict[str, str] = {}
        self.closed: list[str] = []  # the loggers that were closed without an error

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def _each(self, call: Callable[[Any], None]) -> None:
        for t in list(self.trackers):
            try:
                call(t)
                late = getattr(t, "error", None)  # a background tracker's earlier failure
            except Exception as exc:  # noqa: BLE001 - one tracker's failure must not end the run
                late = exc
            if late is not None:
                self._drop(t, late)

    def _drop(self, tracker: Any, exc: BaseException) -> None:
        self.trackers.remove(tracker)
        self.errors[tracker.name] = f"{type(exc).__name__}: {exc}"[:500]
        msg = (f"warning: logger {tracker.name} failed ({self.errors[tracker.name]}); its later points are dropped,"
               " the other loggers go on")
        print(msg, flush=True)
        if self.console is not None:
            print(msg, file=self.console, flush=True)
        if isinstance(tracker, Background):  # stop its thread; its own close may fail again
            try:
                tracker.close()
            except Exception:  # noqa: BLE001
                pass

    def log(self, scalars: dict[str, float], step: int) -> None:
        """Record ``scalars`` at ``step`` in every tracker."""
        self._each(lambda t: t.log(scalars, step))

    def resume_at(self, step: int) -> None:
        self._each(lambda t: t.resume_at(step))

    def flush(self) -> None:
        self._each(lambda t: t.flush())

    def close(self) -> None:
        """Flush and close every tracker (the last background writes are waited for)."""
        self.flush()
        for t in list(self.trackers):
            try:
                t.close()
                if getattr(t, "error", None) is not None:
                    raise t.error
                self.closed.append(t.name)
            except Exception as exc:  # noqa: BLE001
                self._drop(t, exc)
        self.trackers = []

    def report(self) -> dict[str, Any]:
        """For summary.json: the loggers that ran to the end, and the error of each that failed."""
        return {"ok": self.closed or self.names, "failed": dict(self.errors)}
