"""Driver-side data preparation: resolve where a task's data lives and how many samples it has.

Runs before any process starts so a too-small dataset is refused up front, and so a default corpus is
built once by the driver rather than raced for by the ranks. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from runner.plan import PlanError


def prepare(data: dict[str, Any], task: dict[str, Any]) -> int | None:
    """Fill in defaults in ``data`` (in place) and return the number of training samples, if known."""
    kind = data.get("name")
    if kind == "synthetic":
        n = data.get("num_samples")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise PlanError("data.num_samples", n, "must be a positive integer", "e.g. data.num_samples=64")
        return n
    if kind == "text":
        from runner import corpus

        if not data.get("path"):
            data["path"] = corpus.default_corpus_path()
        context = task["model"]["context"]
        try:
            train, _val = corpus.count_samples(data["path"], data.get("format", "auto"), context,
                                               data.get("val_fraction", 0.1))
        except FileNotFoundError as exc:
            raise PlanError("data.path", data["path"], f"not found ({exc})",
                            "point data.path at an existing file (any fsspec URL), or null for the default"
                            " corpus") from exc
        return train
    return None


def describe(data: dict[str, Any]) -> dict[str, Any] | None:
    """The data's source for run.json (placeholder until the data work lands)."""
    return {"path": data.get("path")} if data.get("name") == "text" else None
