"""Reading a run directory's records (run.json, summary.json, config.yaml, a checkpoint's meta.json) so that a
damaged one is a refusal that names the file, what is wrong with it and the fix, never a traceback.

Every command that reads a run directory (``ddp-run resume=…``, ``ddp-compare``, ``ddp-runs``, the sweep record,
the projection, the launchers through ``RunDir.read_json``) reads its JSON through :func:`read_json`, whose one
failure is :class:`DamagedFile`. A file hand-edited, truncated by a full disk or overwritten with garbage is
*damage*; the reader decides whether that ends the command (resume) or only the figures it would have shown (a
listing). The records' shapes: runner/contract/run_files.py.
"""

from __future__ import annotations

import json
from typing import Any

from ddp_runner.contract import command_line, layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.run_files import RunManifest, RunSummary

# Top-level keys every resolved config.yaml holds (conf/config.yaml's groups and keys); a file without one of them
# was cut short or hand-edited, and planning it would fail somewhere far from the cause.
CONFIG_SECTIONS = ("world_size", "batch", "device", "backend", "train", "checkpoint", "output", "task", "launcher",
                   "data", "strategy")


class DamagedFile(ValueError):
    """A run-directory file that exists but cannot be read as what it should be."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"{path}: {problem}")

    def refusal(self, key: str = "resume") -> PlanError:
        """The same as a plan refusal (``ddp-run``'s exit 2), naming the file as the value."""
        return PlanError(key, self.path, f"is damaged: {self.problem}", self.fix)

    def line(self, prog: str) -> str:
        """``<prog>: error: <file>: <problem>. Fix: <fix>`` (one line)."""
        return f"{prog}: error: {self.path}: {self.problem}. Fix: {self.fix}"


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


def fix_for(name: str, run: str) -> str:
    """What to do about a damaged ``name`` of the run directory ``run``."""
    if name == layout.SUMMARY:
        return (f"delete {layout.join(run, layout.SUMMARY)} (the run's ending rewrites it), or restore it from a"
                " copy; ddp-compare can also be given the other runs only")
    if name == layout.CONFIG:
        return ("restore it from a copy (it must be the YAML mapping the run was launched with), or start a new run"
                f" with the same overrides from one of its checkpoints: {_from_checkpoint(run)}")
    if name == layout.MANIFEST:
        return f"restore it from a copy, or start a new run from one of its checkpoints: {_from_checkpoint(run)}"
    return f"restore {name} from a copy, or use another checkpoint or run"


def _from_checkpoint(run: str) -> str:
    """``ddp-run … resume=<run>/checkpoints/step_<N>``, the run's path quoted as the shell and Hydra need it."""
    word = command_line.override("resume", layout.join(run, layout.CHECKPOINTS, "step_<N>"))
    return "ddp-run … " + command_line.shell([word])


def parse_json(data: bytes | str, path: str, fix: str, want: type = dict) -> Any:
    """``data`` as JSON of type ``want``; :class:`DamagedFile` naming ``path`` otherwise."""
    try:
        value = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError of bytes that are not UTF-8
        problem = ("empty (cut short?)" if not data.strip()
                   else f"not valid JSON, truncated or corrupted ({_short(exc)})")
        raise DamagedFile(path, problem, fix) from None
    if not isinstance(value, want):
        raise DamagedFile(path, f"holds a JSON {type(value).__name__}, not an {want.__name__}", fix)
    return value


def read_json(fs: Any, path: str, fix: str, missing_ok: bool = True, want: type = dict) -> Any:
    """A JSON record of the run tree (None when absent and ``missing_ok``); :class:`DamagedFile` when it cannot be
    read or parsed, or is not a ``want``."""
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise DamagedFile(path, "is missing", fix) from None
    except (OSError, ValueError) as exc:
        raise DamagedFile(path, f"cannot be read ({_short(exc)})", fix) from None
    return parse_json(data, path, fix, want)


def read_url(url: str, fix: str, missing_ok: bool = True, want: type = dict) -> Any:
    """:func:`read_json` of the file at ``url`` (a path or any fsspec URL)."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:  # a protocol whose package is not installed, a malformed URL
        raise DamagedFile(url, f"cannot be read ({_short(exc)})", fix) from None
    return read_json(fs, path, fix, missing_ok, want)


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """Why a parsed run.json is not a ddp-run manifest a reader can trust (None: it is)."""
    if manifest == {}:
        return "empty (its driver died while creating it?)"
    if not isinstance(manifest.get("status"), str):
        return "has no status"
    if not isinstance(manifest.get("plan"), dict):
        return "has no plan"
    for key in ("invocation", "driver", "data"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            return f"its {key!r} is not a mapping (hand-edited or corrupted)"
    return None


def read_manifest(fs: Any, run: str) -> RunManifest:
    """A run's run.json, checked to be a manifest (:class:`DamagedFile` otherwise, or when missing)."""
    path = layout.join(run, layout.MANIFEST)
    fix = fix_for(layout.MANIFEST, run)
    manifest = read_json(fs, path, fix, missing_ok=False)
    if (problem := manifest_problem(manifest)) is not None:
        raise DamagedFile(path, problem, fix)
    return manifest  # type: ignore[return-value]  # checked as far as a reader relies on it


def read_summary(fs: Any, run: str) -> RunSummary | None:
    """A run's summary.json (None when it has none yet)."""
    return read_json(fs, layout.join(run, layout.SUMMARY), fix_for(layout.SUMMARY, run))


def parse_config(text: bytes | str, path: str, run: str, complete: bool = True) -> dict[str, Any]:
    """A run's config.yaml as a plain mapping, resolved; :class:`DamagedFile` when it is not YAML, not a mapping,
    or lacks one of :data:`CONFIG_SECTIONS` (cut short)."""
    from omegaconf import OmegaConf

    fix = fix_for(layout.CONFIG, run)
    try:
        if isinstance(text, bytes):
            text = text.decode()
        conf = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as exc:  # noqa: BLE001 - YAML's, OmegaConf's and decoding errors alike: the file is damaged
        if "oc.env" in str(exc):  # a value from the environment (never written to disk) that is not set now
            raise DamagedFile(path, f"takes a value from the environment, which is not set now ({_short(exc)})",
                              "set that environment variable again (as for the run's first launch), then continue"
                              ) from None
        raise DamagedFile(path, f"is not valid YAML ({_short(exc)})", fix) from None
    if not isinstance(conf, dict):
        raise DamagedFile(path, f"holds a YAML {type(conf).__name__}, not the run's config mapping", fix)
    if not complete:
        return conf
    missing = [k for k in CONFIG_SECTIONS if k not in conf]
    if missing:
        raise DamagedFile(path, f"has no {', '.join(missing)} (cut short, or hand-edited)", fix)
    wrong = [k for k in ("batch", "train", "checkpoint", "output", "task", "launcher", "data", "strategy")
             if not isinstance(conf[k], dict)]
    if wrong:
        raise DamagedFile(path, f"its {wrong[0]!r} is not a mapping (cut short, or hand-edited)", fix)
    return conf


def env_interpolations(raw: Any, prefix: str = "") -> dict[str, str]:
    """``{dotted key: its text}`` of the values of an unresolved config that come from the environment
    (``${oc.env:NAME}``): config.yaml keeps the text, never the value, and a continued run resolves it again."""
    out: dict[str, str] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            out.update(env_interpolations(v, f"{prefix}{k}."))
    elif isinstance(raw, str) and "oc.env" in raw and "${" in raw:
        out[prefix[:-1]] = raw
    return out


def yaml_text_container(text: str) -> Any:
    """config.yaml's text as a plain container, interpolations (``${oc.env:…}``) left as text."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(text), resolve=False)


def read_config_text(fs: Any, run: str) -> str:
    """config.yaml's text (:class:`DamagedFile` when missing or unreadable)."""
    path = layout.join(run, layout.CONFIG)
    try:
        return fs.cat_file(path).decode()
    except FileNotFoundError:
        raise DamagedFile(path, "is missing", fix_for(layout.CONFIG, run)) from None
    except (OSError, ValueError) as exc:
        raise DamagedFile(path, f"cannot be read ({_short(exc)})", fix_for(layout.CONFIG, run)) from None


def read_config(fs: Any, run: str, complete: bool = True) -> dict[str, Any]:
    """A run's config.yaml (:class:`DamagedFile` when missing or damaged; with ``complete``, also when it lacks
    a section a launch needs)."""
    path = layout.join(run, layout.CONFIG)
    try:
        text = fs.cat_file(path)
    except FileNotFoundError:
        raise DamagedFile(path, "is missing", fix_for(layout.CONFIG, run)) from None
    except OSError as exc:
        raise DamagedFile(path, f"cannot be read ({_short(exc)})", fix_for(layout.CONFIG, run)) from None
    return parse_config(text, path, run, complete)
