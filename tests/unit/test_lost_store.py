"""asyncio's "Task exception was never retrieved" for a lost object store's connection errors stays off the
driver's console (runner/rundir/lost_store.py); every other unretrieved exception is still reported."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from ddp_runner.rundir import lost_store


def _unretrieved(exc: BaseException) -> None:
    """A task that fails with ``exc`` on a real event loop and is collected without anyone awaiting it, as
    aiohttp's body writer is when the store closes the connection under it."""

    async def write_body() -> None:
        raise exc

    async def request() -> None:
        asyncio.get_running_loop().create_task(write_body())
        await asyncio.sleep(0.01)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(request())
    finally:
        loop.close()
    gc.collect()


class ClientConnectionError(Exception):
    """Named as aiohttp's base of its connection errors (not all of which are OSErrors)."""


class ServerDisconnectedError(ClientConnectionError):
    pass


@pytest.mark.parametrize("exc", [ConnectionResetError("Cannot write to closing transport"),
                                 BrokenPipeError(32, "Broken pipe"), ServerDisconnectedError("gone")])
def test_a_lost_connection_is_not_reported_by_asyncio(caplog: pytest.LogCaptureFixture, exc: BaseException) -> None:
    lost_store.quiet_unretrieved_connection_errors()
    lost_store.quiet_unretrieved_connection_errors()
    assert logging.getLogger("asyncio").filters.count(lost_store._FILTER) == 1, "installed once"
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _unretrieved(exc)
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_any_other_unretrieved_exception_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    lost_store.quiet_unretrieved_connection_errors()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _unretrieved(ValueError("a bug in the writer"))
    [record] = [r for r in caplog.records if r.name == "asyncio"]
    assert record.getMessage().startswith("Task exception was never retrieved")
    assert record.exc_info and isinstance(record.exc_info[1], ValueError)


def test_a_remote_runs_staging_folder_quiets_them(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every driver of a remote run (new, continued, each node's) makes its staging folder before it copies."""
    from ddp_runner.rundir import run_dir

    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(run_dir.tempfile, "tempdir", None)
    run_dir.staging_dir("bucket/out/run")
    assert lost_store._FILTER in logging.getLogger("asyncio").filters
