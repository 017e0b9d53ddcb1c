"""Driver-side data preparation: resolve where a task's data lives, how many samples it has, and what it is.

Runs before any process starts so that bad data (a missing, empty, truncated or too-small token file) is
refused up front with its real problem, and so that a default corpus is built once by the driver rather than
raced for by the ranks. Imports no torch (numpy only inside the scan that needs it).
"""

from __future__ import annotations

import hashlib
from datetime import UTC
from typing import Any

from ddp_runner.contract import corpus
from ddp_runner.contract.errors import PlanError

# Files up to this size are hashed at every launch (a fraction of a second); larger ones are identified by
# size and modification time instead: hashing many GB per launch would cost more than it tells.
HASH_MAX_BYTES = 64 * 2**20
_HASH_CHUNK = 4 * 2**20


def prepare(data: dict[str, Any], task: dict[str, Any]) -> int | None:
    """Fill in defaults in ``data`` (in place), refuse unusable data, and return the training sample count.

    For ``data: text``: ``data.path`` (and ``data.val_path`` when set) must be non-empty files of whole tokens
    giving at least one sample of ``task.model.context`` each. Raises :class:`PlanError` naming the key.
    """
    from ddp_runner.config import validate

    validate.check_data(data)
    kind = data.get("name")
    if kind == "synthetic":
        if "num_samples" not in data:
            raise PlanError("data.num_samples", None, "is missing", "e.g. data.num_samples=64")
        return data["num_samples"]
    if kind == "text":
        return _prepare_text(data, task)
    return None


def _prepare_text(data: dict[str, Any], task: dict[str, Any]) -> int:
    from ddp_runner.config import validate

    # Samples are windows of the task's context + 1 tokens: the text data group reads this one task key.
    context = validate.get({"task": task}, "task.model.context")
    if context is None:
        raise PlanError("task.model.context", None, "data=text cuts samples of task.model.context tokens, and this"
                        " task sets none", "use a task that sets task.model.context (task=gpt), or another data group")
    validate.check_keys({"task": task}, [validate.integer("task.model.context", lo=1, example="64")])
    if not data.get("path"):
        data["path"] = corpus.default_corpus_path()
    fmt = data.get("format", "auto")
    if fmt not in corpus.FORMATS:
        raise PlanError("data.format", fmt, "unknown token format", f"use one of {', '.join(corpus.FORMATS)}")
    val_path = data.get("val_path") or None
    val_fraction = data.get("val_fraction", 0.1)
    if val_path is None and (isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float))
                             or not 0.0 <= val_fraction < 1.0):
        raise PlanError("data.val_fraction", val_fraction, "must be a number in [0, 1)",
                        "e.g. data.val_fraction=0.1, or data.val_path=<a validation token file>")
    path = data["path"]
    n_tokens = _check_token_file("data.path", path, fmt)
    if val_path is not None:
        _check_token_file("data.val_path", val_path, fmt)
    train_range, val_range = corpus.token_ranges(path, fmt, float(val_fraction), val_path)
    train, val = (corpus.num_windows(r.n_tokens, context) for r in (train_range, val_range))
    if train == 0:
        held_out = "" if val_path else f" ({train_range.n_tokens} for training after the data.val_fraction tail)"
        raise PlanError("data.path", path,
                        f"holds {n_tokens} {train_range.fmt} tokens{held_out}: too few for one sample of"
                        f" task.model.context={context}, which needs {context + 1}",
                        "use a larger file, or a smaller task.model.context"
                        + ("" if val_path else " or data.val_fraction"))
    if val_path is not None and val == 0:
        raise PlanError("data.val_path", val_path,
                        f"holds {val_range.n_tokens} {val_range.fmt} tokens: too few for one validation sample of"
                        f" task.model.context={context}, which needs {context + 1}",
                        "use a larger validation file, or data.val_path=null to hold out data.val_fraction of"
                        " data.path")
    return train


def _check_token_file(key: str, url: str, fmt: str) -> int:
    """Refuse ``url`` unless it is a non-empty file of whole tokens; return its token count."""
    import fsspec


    try:
        fs, fs_path = fsspec.core.url_to_fs(url)
        info = fs.info(fs_path)
    except FileNotFoundError as exc:
        fix = (f"point {key} at an existing token file (any fsspec URL)"
               + (", or null for the default corpus" if key == "data.path" else
                  ", or data.val_path=null to hold out data.val_fraction of data.path"))
        raise PlanError(key, url, "not found", fix) from exc
    except Exception as exc:  # noqa: BLE001 - an unknown protocol, a backend's own errors (botocore's…): a refusal
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise PlanError(key, url, f"cannot be opened ({type(exc).__name__}: {first})",
                        "check the URL, its fsspec backend package and its credentials (pass credentials through"
                        " the environment or the backend's own configuration, not inside the URL)") from None
    if info.get("type") == "directory":
        base = url.rstrip("/")
        name = "train.bin" if key == "data.path" else "val.bin"
        if fs.isfile(f"{fs_path.rstrip('/')}/{name}"):
            fix = f"set {key}={base}/{name}"
            if key == "data.path" and fs.isfile(f"{fs_path.rstrip('/')}/val.bin"):
                fix += f" data.val_path={base}/val.bin"
        else:
            fix = f"point {key} at a token file inside it (ddp-tokenize writes train.bin and val.bin)"
        raise PlanError(key, url, "is a directory, not a token file", fix)
    size = int(info.get("size") or 0)
    concrete = corpus.resolve_format(url, fmt)
    if size == 0:
        raise PlanError(key, url, "is empty (0 bytes)",
                        f"point {key} at a file that holds tokens (ddp-tokenize makes them from text)")
    itemsize = corpus.ITEMSIZE[concrete]
    if size % itemsize:
        why = "data.format=uint16" if fmt == "uint16" else "data.format=auto and the .bin name"
        raise PlanError(key, url,
                        f"has {size} bytes, an odd number, so it is not whole uint16 tokens (read as uint16: {why})",
                        "if it is text, set data.format=bytes; if it is a token file, it is truncated or corrupt:"
                        " make it again (ddp-tokenize)")
    return size // itemsize


def describe(data: dict[str, Any]) -> dict[str, Any] | None:
    """What the run trains on, for run.json: files, format, size, tokens, identity, vocabulary, meta.json.

    None for data that is not read from files (``data: synthetic``). Call after :func:`prepare` (which has
    filled in the default corpus and refused missing files). Each file is identified by the sha256 of its bytes
    when at most ``HASH_MAX_BYTES``, else by size and modification time (``identity`` says which); ``meta``
    is the ``meta.json`` beside ``data.path`` (ddp-tokenize's, with the source text's ``source_sha256``).
    """
    if data.get("name") != "text":
        return None

    path = data.get("path") or corpus.default_corpus_path()
    val_path = data.get("val_path") or None
    fmt = data.get("format", "auto")
    train = _describe_file(path, corpus.resolve_format(path, fmt))
    out: dict[str, Any] = {"path": path, "val_path": val_path, **train}
    if val_path is not None:
        out["val"] = _describe_file(val_path, corpus.resolve_format(val_path, fmt))
        out["split"] = "data.path trains, data.val_path validates"
    else:
        out["val"] = None
        out["split"] = f"the last data.val_fraction={data.get('val_fraction', 0.1)} of data.path validates"
    meta = corpus.token_meta(path) if train["format"] == "uint16" else None
    out["meta"] = meta
    out["vocab_size"] = _known_vocab(data, meta, path, train["format"])
    return out


def _known_vocab(data: dict[str, Any], meta: dict[str, Any] | None, path: str, fmt: str) -> int | None:
    """The data's vocabulary when it is declared (no scan: vocab_needed did that before launch)."""

    if data.get("vocab") is not None:
        return int(data["vocab"])
    if corpus.FORMAT_VOCAB[fmt] is not None:
        return corpus.FORMAT_VOCAB[fmt]
    if meta is not None and isinstance(meta.get("vocab_size"), int) and corpus.meta_describes(meta, path, fmt):
        return meta["vocab_size"]
    return None


def _describe_file(url: str, fmt: str) -> dict[str, Any]:
    """Format, size, tokens and identity (sha256, or size + mtime when large) of one token file."""
    import fsspec


    out: dict[str, Any] = {"format": fmt}
    try:
        fs, fs_path = fsspec.core.url_to_fs(url)
        size = int(fs.size(fs_path))
        out.update(bytes=size, tokens=size // corpus.ITEMSIZE[fmt], mtime=_mtime(fs, fs_path))
        if size <= HASH_MAX_BYTES:
            digest = hashlib.sha256()
            with fs.open(fs_path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
            out.update(sha256=digest.hexdigest(), identity="sha256")
        else:
            out.update(sha256=None,
                       identity=f"size+mtime (larger than {HASH_MAX_BYTES // 2**20} MB: not hashed at launch)")
    except Exception as exc:  # noqa: BLE001 - describing must never stop a run that prepare() accepted
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _mtime(fs: Any, fs_path: str) -> str | None:
    """The file's modification time (ISO 8601, UTC) when its filesystem knows one."""
    try:
        modified = fs.modified(fs_path)
    except (NotImplementedError, OSError, AttributeError, KeyError):
        return None
    if modified.tzinfo is None:
        modified = modified.replace(tzinfo=UTC)  # fsspec returns naive UTC for local files
    return modified.astimezone(UTC).isoformat(timespec="seconds")
