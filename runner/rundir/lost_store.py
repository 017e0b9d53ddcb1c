"""A lost object store on the console: the driver's own line per failed copy, not asyncio's tracebacks.

fsspec's async filesystems (s3fs over aiohttp) run their requests on an event loop of their own. When the store goes
away while a request's body is being sent, aiohttp's task that writes it ends with a connection error that nobody
awaits, and asyncio reports it when the task is collected: "Task exception was never retrieved" and a traceback on
stderr, beside the driver's own account of the same failure ("could not mirror ...", "FAILED while finalising").
Those reports are dropped; every other asyncio record, and every other unretrieved exception, is kept.
"""

from __future__ import annotations

import logging

_UNRETRIEVED = "Task exception was never retrieved"


def _connection_error(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) or any(c.__name__ == "ClientConnectionError" for c in type(exc).__mro__)


class _DropLostConnections(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_UNRETRIEVED) or not record.exc_info:
            return True
        return not _connection_error(record.exc_info[1])


_FILTER = _DropLostConnections()


def quiet_unretrieved_connection_errors() -> None:
    """Drop asyncio's reports of connection errors that no one awaited (the driver reports the failed copy itself).
    Idempotent."""
    logger = logging.getLogger("asyncio")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
