"""CSV: ``<run>/metrics.csv``, one row per logged step, one column per scalar, for a spreadsheet.

A step's row is written once the next step's scalars arrive (a validation adds its columns to the same row), or at
a flush; a scalar of that step logged after the flush goes into the same row too. A scalar seen for the first time
rewrites the file with the wider header (rare: the first steps, the first validation). A resumed launch keeps the
rows up to the step it continues after.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from ddp_runner.contract.osutil import atomic_write


class CsvLog:
    """The CSV tracker."""

    name = "csv"

    def __init__(self, path: str) -> None:
        self.path = path
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []  # written rows, kept to rewrite the file when a column is added
        self.pending: dict[str, Any] | None = None
        self._file: Any = None  # open for appending between rewrites: a row costs one write
        self._replace = False  # the pending row is one already in the file
        if os.path.exists(path):  # a continued run: what earlier launches wrote
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or ["step"])
                self.rows = list(reader)

    def log(self, scalars: dict[str, float], step: int) -> None:
        if self.pending is not None and self.pending["step"] != step:
            self._write(self.pending)
            self.pending = None
        if self.pending is None:
            if self.rows and int(self.rows[-1]["step"]) == step:
                # A flush wrote this step's row already (the final checkpoint is saved before the final validation):
                # the row grows, and the file is rewritten with it.
                self.pending, self._replace = self.rows.pop(), True
            else:
                self.pending = {"step": step}
        self.pending.update(scalars)

    def _write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.columns]
        self.rows.append(row)
        if new or self._replace:
            self.columns += new
            self._replace = False
            self._rewrite()
            return
        if self._file is None:
            self._file = open(self.path, "a", newline="")  # noqa: SIM115 - kept open across rows, closed in close()
        csv.DictWriter(self._file, self.columns).writerow(row)
        self._file.flush()

    def _rewrite(self) -> None:
        import io

        if self._file is not None:
            self._file.close()
            self._file = None
        buf = io.StringIO()
        writer = csv.DictWriter(buf, self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write(self.path, buf.getvalue())

    def resume_at(self, step: int) -> None:
        self.rows = [r for r in self.rows if int(r["step"]) <= step]
        self._rewrite()

    def flush(self) -> None:
        if self.pending is not None:
            self._write(self.pending)
            self.pending = None

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
