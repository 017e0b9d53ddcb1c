"""The commands the tools print for a person to type (``ddp-run resume=…`` and the like), written so that they run
as printed: each word quoted for a POSIX shell, and each override's value quoted for Hydra's override grammar
where that grammar would read it otherwise (a folder named ``0_gpt_w1_seed=1``, a non-ASCII letter, a space).

Hydra's grammar (hydra/grammar/OverrideLexer.g4): an unquoted value may hold ASCII letters, digits, ``_ - / \\ +
. $ % * @ ? |`` and ``:``; ``= , ( ) [ ] { }``, spaces and any other character need quoting, and a value that reads
as a number, a bool or null is no string unless quoted. In a quoted value only backslashes that precede a quote (or
the closing quote) are escapes, and ``${`` still starts an interpolation (``\\${`` is a literal one).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

# What Hydra reads, unquoted, as the same string: the lexer's unquoted characters less '\' (an escape) and '$' (an
# interpolation), and ':'.
_PLAIN = re.compile(r"[A-Za-z0-9_\-/+.%*@?|:]+")
# Unquoted values Hydra types as something else: ints, floats (inf, nan), bools, null.
_TYPED = re.compile(r"[+-]?(([0-9][0-9_]*)?\.?[0-9_]*(e[+-]?[0-9_]+)?|inf|nan|true|false|null)", re.IGNORECASE)


def hydra_value(value: str) -> str:
    """``value`` as Hydra's override grammar reads it back as this very string: unchanged where it can, else in
    double quotes with its quotes, the backslashes before them and ``${`` escaped."""
    if _PLAIN.fullmatch(value) and not _TYPED.fullmatch(value):
        return value
    # OmegaConf's escape of a literal '${' (and of the backslashes before one)
    body = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    body = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', body)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)  # before the closing quote
    return '"' + body + '"'


def override(key: str, value: str) -> str:
    """``key=value`` as one override Hydra accepts (:func:`hydra_value`), before shell quoting."""
    return f"{key}={hydra_value(value)}"


def shell(words: Iterable[str]) -> str:
    """``words`` as one shell line (each quoted only where the shell needs it)."""
    return shlex.join(words)


def ddp_run(*overrides: str, options: Iterable[str] = ()) -> str:
    """``ddp-run [options] overrides…`` as a shell line; ``overrides`` are already in Hydra's form (:func:`override`
    for a value of this program's making, a user's own words as given)."""
    return shell(["ddp-run", *options, *overrides])


def resume(run_url: str, *more: str) -> str:
    """``ddp-run resume=<run_url> more…``: the command that continues the run in place."""
    return ddp_run(override("resume", run_url), *more)
