"""One interface for every tracker, and the fan-out rank 0 writes through.

A tracker takes a step's scalars at once (:meth:`Tracker.log`), is told where a resumed launch starts
(:meth:`Tracker.resume_at`), is flushed before a checkpoint (what a checkpoint covers has reached the tracker, so a
resume from it leaves no gap) and closed at the end. Only rank 0 opens trackers: one tracker run per job whatever the
world size; every rank's figures reach rank 0 through the log step's gather (tasks/engine/reporting/log_window.py).

A tracker whose writes go over the network (MLflow, W&B online) is wrapped in :class:`Background`: the training loop
never waits on a request. A tracker that fails mid-run is never silent: rank 0's console and log say so once, it is
dropped, the others go on, and summary.json's ``trackers`` records the error.
"""

from __future__ import annotations

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
    """Runs a tracker's calls on one thread of its own, in order; :meth:`flush` waits for them. Log points that
    queued up while a request was in flight go out together in one call (``log_many`` where the tracker has it): a
    server slower than the training steps gets fewer, larger requests instead of a growing queue."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.error: BaseException | None = None
        self._cv = threading.Condition()
        self._todo: list[tuple[int, str, tuple[Any, ...]]] = []
        self._seq = self._done = 0
        self._thread = threading.Thread(target=self._work, name=f"tracker-{self.name}", daemon=True)
        self._thread.start()

    def _submit(self, kind: str, args: tuple[Any, ...]) -> int:
        with self._cv:
            self._seq += 1
            self._todo.append((self._seq, kind, args))
            self._cv.notify_all()
            return self._seq

    def _call(self, kind: str, batch: list[tuple[Any, ...]]) -> None:
        if self.error is not None:
            return
        try:
            if kind == "log" and hasattr(self.inner, "log_many"):
                self.inner.log_many(batch)
            else:
                for args in batch:
                    getattr(self.inner, kind)(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by the fan-out, on the training thread
            self.error = exc

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._todo:
                    self._cv.wait()
                todo, self._todo = self._todo, []
            i = 0
            while i < len(todo):
                j = i + 1
                while todo[i][1] == "log" and j < len(todo) and todo[j][1] == "log":
                    j += 1  # consecutive log points: one call
                self._call(todo[i][1], [args for _, _, args in todo[i:j]])
                with self._cv:
                    self._done = todo[j - 1][0]
                    self._cv.notify_all()
                if todo[i][1] == "close":
                    return
                i = j

    def _wait(self, seq: int) -> None:
        with self._cv:
            while self._done < seq and self._thread.is_alive():
                self._cv.wait(timeout=1.0)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._submit("log", (scalars, step))

    def resume_at(self, step: int) -> None:
        self._submit("resume_at", (step,))

    def flush(self) -> None:
        self._wait(self._submit("flush", ()))

    def close(self) -> None:
        if self._thread.is_alive():
            self._wait(self._submit("close", ()))
        self._thread.join(timeout=60)


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
