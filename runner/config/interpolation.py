"""The composed config resolved, every interpolation that fails (``${oc.env:UNSET}``, ``${now:}``, a key that does not
exist, a resolver that does not exist) refused before anything starts: the key, the text as given, and the fix,
never OmegaConf's traceback."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigCycleDetectedException, GrammarParseError, InterpolationResolutionError

from ddp_runner.contract.errors import PlanError

_ENV = re.compile(r"Environment variable '([^']*)' not found")
_KEY = re.compile(r"Interpolation key '([^']*)' not found")
_RESOLVER = re.compile(r"Unsupported interpolation type (\S+)")
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
FIX = "give the value itself, or an interpolation that resolves (docs/refusals.md)"


def resolved(cfg: DictConfig, on_refusal: Callable[[PlanError], int] | None = None) -> dict[str, Any]:
    """``cfg`` as a plain container with every interpolation resolved; PlanError naming the first key whose
    interpolation cannot be resolved. ``on_refusal``: given that PlanError instead (it prints the refusal and
    returns the exit code), and this process exits with its code (``ddp-run``'s job)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (InterpolationResolutionError, GrammarParseError, ConfigCycleDetectedException) as exc:
        key = str(getattr(exc, "full_key", None) or "config")
        err = refusal(key, raw_value(OmegaConf.to_container(cfg, resolve=False), key), exc)
    if on_refusal is None:
        raise err
    sys.exit(on_refusal(err))


def as_typed(node: Any) -> list[str]:
    """Hydra's record of a job's overrides (``hc.overrides.task``) as the strings typed. Read through OmegaConf,
    each string's ``${…}`` would be resolved: ``'train.lr=${oc.env:NOPE}' train.lr=0.1`` must run (the later
    override wins), not fail on the value it replaced."""
    return [str(o) for o in OmegaConf.to_container(node, resolve=False)]  # type: ignore[union-attr]


def refusal(key: str, value: Any, exc: BaseException) -> PlanError:
    """The refusal of ``key`` whose interpolation ``value`` failed with ``exc``: what failed, in words, and the fix."""
    text = (str(getattr(exc, "msg", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
    if m := _ENV.search(text):
        name = m.group(1) or "<NAME>"
        return PlanError(key, value, f"takes its value from the environment variable {name}, which is not set",
                         f"set it first (export {name}=…), or give a default: ${{oc.env:{name},<default>}}")
    if m := _KEY.search(text):
        return PlanError(key, value, f"refers to {m.group(1)}, which is no key of the config",
                         "interpolate a key that exists (e.g. ${train.epochs}), or give the value itself")
    if m := _RESOLVER.search(text):
        return PlanError(key, value, f"uses a resolver named {m.group(1)!r}, which does not exist",
                         "use one that exists (oc.env, oc.select, oc.decode, now), or give the value itself")
    return PlanError(key, value, f"its interpolation cannot be resolved ({text})", FIX)


def in_composition(exc: BaseException, given: Mapping[str, str]) -> PlanError | None:
    """The refusal of an interpolation that cannot even be parsed (``lr: ${oc.env:"A}`` in a config file, or on
    the command line, whose overrides ``given`` maps key to value), from the exception Hydra's composition raised:
    the key, and the file where the traceback shows which was being read. None when no OmegaConf error naming a
    key is in ``exc``'s chain."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        key = getattr(cause, "full_key", None)
        if key and isinstance(cause, (GrammarParseError, InterpolationResolutionError)):
            text = (str(getattr(cause, "msg", None) or cause).strip().splitlines() or [type(cause).__name__])[0]
            where = _file_read(cause)
            value = _raw_in(where, str(key)) if where else given.get(str(key))
            return PlanError(str(key), value, f"its interpolation cannot be parsed ({text})"
                             + (f" in {where}" if where else ""),
                             "close every quote and brace of ${…}, or give the value itself (docs/refusals.md)")
        cause = cause.__cause__ or cause.__context__
    return None


def _file_read(exc: BaseException) -> str | None:
    """The config file being read when ``exc`` was raised: Hydra's file source holds it as ``full_path``."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        path = tb.tb_frame.f_locals.get("full_path")
        if tb.tb_frame.f_code.co_name == "load_config" and isinstance(path, str):
            found = path
        tb = tb.tb_next
    return found


def _raw_in(path: str, key: str) -> Any:
    """The text of ``key`` in the YAML file ``path``, as the user wrote it; None when it cannot be read."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            tree = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    value = raw_value(tree, key)
    return None if value == key else value


def raw_value(tree: Any, key: str) -> Any:
    """The unresolved value at dotted ``key`` (``a.b[0].c``) of a plain container; ``key`` itself when absent."""
    node = tree
    for name, index in _PART.findall(key):
        try:
            node = node[int(index)] if index else node[name]
        except (KeyError, IndexError, TypeError):
            return key
    return node
