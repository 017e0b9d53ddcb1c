"""Secrets in a config: credentials inside URLs (``scheme://user:password@host``, any scheme fsspec accepts, chained
ones too) and values that came from the environment (``${oc.env:NAME}``). Nothing the runner writes or prints
holds them: run.json, config.yaml, logs, the console, error records and tracebacks get :data:`MASK` instead, and
the workers receive the real values through the environment (:data:`ENV_SECRETS`), never through a file.

Standard library only: both sides import it.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ddp_runner.contract.rules import flatten

MASK = "***"
# {dotted config key: real value} for the values config.yaml holds redacted; set by the driver for its workers.
ENV_SECRETS = "DDP_RUNNER_SECRETS"
# The userinfo of a URL: ``scheme://user:password@`` (the password masked) or ``scheme://token@`` (a token alone is
# a credential too, unless it is a plain user name for ssh-like schemes: masked all the same, it is cheap).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s'\"]*)(?::(?P<pw>[^/@\s'\"]*))?@")
# A credential in a URL's query string (``s3://bucket/p?aws_secret_access_key=…``, a presigned URL's signature).
_QUERY = re.compile(r"(?P<head>[?&;](?:[A-Za-z0-9_.\-]*?(?:secret|password|passwd|token|signature|credential|"
                    r"access_key|api_?key|sig)[A-Za-z0-9_.\-]*)=)(?P<value>[^&#\s'\"]*)", re.IGNORECASE)
# Every secret this process has met (the driver's excepthook masks them in tracebacks).
KNOWN: set[str] = set()
_MASKED_URL = re.compile(r"://[^/@\s'\"]*" + re.escape(MASK) + "@")


def _mask_userinfo(m: re.Match[str]) -> str:
    if m.group("pw") is not None:
        return "" if m.group("pw") == MASK else f"{m.group('scheme')}{m.group('user')}:{MASK}@"
    return m.group(0) if m.group("user") == MASK else f"{m.group('scheme')}{MASK}@"


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (its userinfo, credentials in its query string)."""
    text = _USERINFO.sub(lambda m: _mask_userinfo(m) or m.group(0), text)
    return _QUERY.sub(lambda m: m.group("head") + MASK if "://" in text else m.group(0), text)


def url_secrets(text: str) -> list[str]:
    """The credential parts (passwords, tokens) of the URLs in ``text``."""
    found = []
    for m in _USERINFO.finditer(text):
        secret = m.group("pw") if m.group("pw") is not None else m.group("user")
        if secret and secret != MASK:
            found.append(secret)
    if "://" in text:
        found += [m.group("value") for m in _QUERY.finditer(text) if m.group("value") not in ("", MASK)]
    return found


def is_redacted(value: Any) -> bool:
    """Does ``value`` (a config value read back from config.yaml) hold a masked credential?"""
    return isinstance(value, str) and (bool(_MASKED_URL.search(value)) or any(
        m.group("value") == MASK for m in _QUERY.finditer(value)))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret value and every URL credential masked."""
    for s in sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True):
        text = text.replace(s, MASK)
    return redact_urls(text)


def secret_keys(conf: Mapping[str, Any], env_keys: Iterable[str] = ()) -> dict[str, str]:
    """``{dotted key: real value}`` of the config values that hold a secret: the ``env_keys`` (their value came
    from ``oc.env``) and every string holding a URL with credentials."""
    flat, env_keys = flatten(conf), set(env_keys)
    return {k: str(v) for k, v in flat.items()
            if v is not None and (k in env_keys or (isinstance(v, str) and url_secrets(v)))}


def secret_values(conf: Mapping[str, Any], env_keys: Iterable[str] = ()) -> list[str]:
    """The strings to mask wherever the config's values may appear (whole ``oc.env`` values, URL credentials)."""
    env_keys = set(env_keys)
    values = []
    for k, v in secret_keys(conf, env_keys).items():
        values += url_secrets(v) + ([v] if k in env_keys else [])
    return values


def redact_tree(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of a JSON-like ``value`` with every string in it redacted."""
    secrets = list(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {k: redact_tree(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, secrets) for v in value]
    return value


class MaskedStream:
    """A text stream that masks secrets (``masks()``, asked at every write, and URL credentials) in everything
    written to it: the workers' logs, the driver's console and its tracebacks."""

    def __init__(self, stream: Any, masks: Any) -> None:
        self._stream, self._masks = stream, masks

    def write(self, text: str) -> int:
        self._stream.write(redact(text, self._masks()))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def masked_console() -> Iterator[None]:
    """Inside: nothing printed to stdout or stderr (a traceback included) shows a secret of the config (URL
    credentials, values from oc.env), as far as :data:`KNOWN` holds them."""
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MaskedStream(sys.stdout, lambda: KNOWN), MaskedStream(sys.stderr, lambda: KNOWN)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = real_out, real_err


def handed_over() -> list[str]:
    """In a worker: the secret strings the driver handed over (:data:`ENV_SECRETS`): a URL's credentials, or a
    whole value from the environment."""
    import os

    return [s for v in decode(os.environ.get(ENV_SECRETS)).values() for s in (url_secrets(v) or [v])]


def set_key(conf: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``conf[a][b]…`` from ``a.b…`` (the sections exist)."""
    *parents, last = dotted.split(".")
    for p in parents:
        conf = conf[p]
    conf[last] = value


def encode(real: Mapping[str, str]) -> str:
    """The value of :data:`ENV_SECRETS`."""
    return json.dumps(dict(real))


def decode(text: str | None) -> dict[str, str]:
    """:func:`encode`'s mapping back (empty when unset or unreadable)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
