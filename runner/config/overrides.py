"""The shell's arguments, checked before anything starts.

Hydra reports an unknown key, a missing config option or bad override syntax with exit code 1 and no fix, and it
silently accepts ``+train.lrr=0.1`` under a section the runner owns. Here each such problem becomes a refusal
that names the key, the value and the fix (exit 2), with the nearest valid key for a misspelling:

- :func:`diagnose` redoes a composition Hydra failed, in the same search path (``--config-dir`` in both
  spellings, ``hydra.searchpath``), and says which override is wrong (only after a failure, so a valid command
  line is composed once, by Hydra);
- :func:`check_composed` refuses what Hydra accepted but the runner must not (``+`` under owned sections, ``~`` on
  needed keys);
- :func:`check_sweep_groups` checks every value of a swept group before the first job;
- :func:`compose` composes a command line for the answers that run nothing (``--help``, ``--cfg``);
- :func:`user_dir_first` puts a ``--config-dir`` folder holding a primary config ahead of the package's own.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import flatten

# Sections whose keys the driver and the engine define: adding one with `+` is a misspelling, not a new setting.
OWNED = ("batch", "train", "checkpoint", "output", "launcher", "world_size", "device", "backend", "seed",
         "resume", "dry_run", "timeout_s", "watchdog", "fault", "debug")
# Inside owned sections, subtrees that hold free-form settings passed on as they are.
OPEN = ("train.inductor",)
# Keys a task's YAML sets that the workers cannot do without.
TASK_REQUIRED = ("task.name", "task.module", "data.name")
GROUPS = ("task", "data", "launcher", "logger", "experiment")
_GRAMMAR = "see `ddp-run --help`; values with spaces or commas need quotes, e.g. key='a,b'"
# Words a user types to look at runs; ddp-run takes overrides only: the refusal points at ddp-runs.
RUNS_WORDS = ("status", "list", "ls", "runs", "show", "ps")


@dataclass(frozen=True)
class Cli:
    """What Hydra's own argument parser makes of the command line."""

    overrides: list[str]
    config_dir: str | None
    config_name: str | None
    multirun: bool
    info: bool  # --help, --cfg, --info, … : Hydra answers and nothing runs
    cfg: str | None = None  # --cfg's choice: job, hydra or all


def parse(argv: Sequence[str]) -> Cli:
    """Parse ``argv`` with Hydra's own parser (so ``-cd x``, ``--config-dir=x`` … all mean the same)."""
    from hydra._internal.utils import get_args_parser

    args, _unknown = get_args_parser().parse_known_args(list(argv))
    info = bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
                or args.resolve or args.package)
    return Cli(list(args.overrides), args.config_dir, args.config_name, bool(args.multirun), info, args.cfg)


def logger_list(argv: Sequence[str]) -> list[str]:
    """``logger=tensorboard,mlflow`` as ``logger=[tensorboard,mlflow]``: several loggers at once (Hydra would read
    the comma as a sweep over loggers, which no one means)."""
    out = []
    for a in argv:
        key, eq, value = a.partition("=")
        if eq and key.lstrip("+") == "logger" and "," in value and not value.startswith("["):
            a = f"{key}=[{value}]"
        out.append(a)
    return out


def user_dir_first(argv: list[str], config_dir: str, config_name: str | None,
                   package_path: str) -> tuple[list[str], str]:
    """``--config-dir X`` (any spelling), when X holds the primary config, as ``--config-path X`` plus the
    package's configs after it.

    Hydra puts a ``--config-dir`` folder *after* the primary config path, so the package's own ``config.yaml``
    would shadow the user's (a run directory's saved ``config.yaml`` could not be rerun). Here the user's folder
    comes first and the package's configs stay reachable behind it. A folder that holds only config groups (a
    task of the user's own) stays an extra folder, as Hydra defines it. Returns the arguments and the primary
    config path.
    """
    if not os.path.isdir(config_dir):
        raise PlanError("--config-dir", config_dir, "no such directory",
                        "point --config-dir (-cd) at a folder holding your configs (e.g. task/<name>.yaml)")
    if (not os.path.isfile(os.path.join(config_dir, f"{config_name or 'config'}.yaml"))
            or any(a.startswith(("hydra.searchpath=", "+hydra.searchpath=")) for a in argv)):
        return argv, package_path
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-cd", "--config-dir"):
            skip = True
        elif not a.startswith(("--config-dir=", "-cd=")):
            out.append(a)
    path = os.path.abspath(config_dir)
    return ["--config-path", path, *out, f"hydra.searchpath=[{package_path}]"], path


def _loader(config_path: str, config_dir: str | None) -> Any:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search = create_config_search_path(config_path)
    if config_dir is not None:  # where Hydra puts it: after the primary config path
        search.prepend(provider="command-line", path=f"file://{os.path.abspath(config_dir)}",
                       anchor=SearchPathQuery(provider="schema"))
    return ConfigLoaderImpl(config_search_path=search)


def diagnose(cli: Cli, config_path: str, primary: str = "config") -> PlanError:
    """Why Hydra could not compose this command line, as a refusal naming the key, the value and the fix.

    Run only after Hydra failed (composing twice would cost every launch a few hundred milliseconds): the
    composition is redone in the same search path and each override is checked against the keys that exist.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, MissingConfigException
    from hydra.types import RunMode

    from ddp_runner.config import interpolation

    if word := next((o for o in cli.overrides if o in RUNS_WORDS), None):
        return PlanError("overrides", word, "is a command, not an override (ddp-run takes key=value overrides)",
                         "to list your runs: ddp-runs [ROOT]; to see one run: ddp-runs show DIR")
    try:
        parsed = OverridesParser.create().parse_overrides(cli.overrides)
    except HydraException as exc:
        bad = str(exc).strip().splitlines()[0]
        return PlanError("overrides", " ".join(cli.overrides), f"cannot be parsed ({bad})", _GRAMMAR)
    loader = _loader(config_path, cli.config_dir)
    name = cli.config_name or primary
    try:
        loader.load_configuration(name, [_first(o) for o in parsed], run_mode=RunMode.RUN)
    except MissingConfigException as exc:
        return _missing(exc, parsed, name)
    except HydraException as exc:
        given = {o.key_or_group: o.input_line.partition("=")[2] for o in parsed}
        if (unparsable := interpolation.in_composition(exc, given)) is not None:
            return unparsable
        base = _base_keys(loader, name, parsed)
        for o in parsed:
            try:
                _check_key(o, base)
            except PlanError as err:
                return err
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return PlanError("overrides", " ".join(cli.overrides), said, _GRAMMAR)
    for o in parsed:
        try:
            _check_sweep_groups(o, loader)
        except PlanError as err:
            return err
    return PlanError("overrides", " ".join(cli.overrides), "Hydra could not compose the config", _GRAMMAR)


def on_resume(err: PlanError, cli: Cli) -> PlanError:
    """A composition refusal of a ``resume=`` command that names a ``task.`` key: a continued run's task and model
    are its checkpoint's, so the fix is to drop the key (or start a new run), not another spelling of it."""
    resume = next((o.split("=", 1)[1] for o in cli.overrides if o.startswith("resume=")), None)
    if resume is None or not err.key.startswith("task."):
        return err
    return PlanError(err.key, err.value, f"{err.problem}: resume={resume} takes its task and model from the"
                     " checkpoint's run, and they cannot change on resume",
                     f"drop {err.key}= (docs/resume.md lists what may change on resume), or start a new run from"
                     " step 0 with it")


def skip_mode_probe() -> None:
    """Hydra composes the config twice per launch, once only to read ``hydra.mode``. Our config never sets
    it, so outside ``-m`` the probe is skipped: ~50 ms of start-up, which matters for short runs."""
    from hydra._internal.hydra import Hydra

    if hasattr(Hydra, "get_mode"):
        Hydra.get_mode = lambda self, config_name, overrides: None  # None = decided by --multirun alone


def compose(cli: Cli, config_path: str) -> Any:
    """The config ``cli`` composes (a sweep's first value per key), as Hydra would, for the answers that run
    nothing (``--help``, ``--cfg``); a HydraException when it cannot be composed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    parsed = OverridesParser.create().parse_overrides(cli.overrides)
    loader = _loader(config_path, cli.config_dir)
    return loader.load_configuration(cli.config_name or "config", [_first(o) for o in parsed], run_mode=RunMode.RUN)


def check_sweep_groups(cli: Cli, config_path: str) -> None:
    """Every value of a swept group (``task=smoke,gpt``) must exist before the first job starts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(cli.overrides)
    if any(_is_group(o.key_or_group) and o.is_sweep_override() for o in parsed):
        loader = _loader(config_path, cli.config_dir)
        for o in parsed:
            _check_sweep_groups(o, loader)


def check_composed(overrides: Sequence[str], cfg: Mapping[str, Any]) -> None:
    """What Hydra accepts but the runner must not: ``+`` adding a new key under a section the runner owns (a
    misspelling: an existing key cannot be added), ``~`` removing a key the workers need, and a task that
    lacks the keys its workers read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = set(flatten(dict(cfg)))
    for k in list(keys):
        parts = k.split(".")
        keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        key = o.key_or_group
        if (o.is_add() or o.is_force_add()) and _owned(key):
            _check_key(o, keys - {key})
        elif o.is_delete():
            _check_key(o, keys)
    for key in TASK_REQUIRED:
        if key not in keys:
            raise PlanError(key, None, "is missing from the composed config, and the workers need it",
                            "pick a task with task=<name> (its YAML sets task.name, task.module and the data group)")


def _first(o: Any) -> str:
    """The override with a sweep reduced to its first value (composition takes one value per key)."""
    if not o.is_sweep_override():
        return o.input_line
    value = next(iter(o.sweep_string_iterator()))
    return f"{o.get_key_element()}={value}"


def _flat_keys(cfg: Any) -> set[str]:
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False)
    tree.pop("hydra", None)
    keys = set(flatten(tree))
    for k in list(keys):  # every prefix is a key too (``train`` as well as ``train.lr``)
        parts = k.split(".")
        keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return keys


def _base_keys(loader: Any, name: str, parsed: list[Any]) -> set[str]:
    """Keys of the config composed with the group choices only: what a key override may name."""
    from hydra.types import RunMode

    groups = [_first(o) for o in parsed if _is_group(o.key_or_group) and not o.is_delete()]
    try:
        return _flat_keys(loader.load_configuration(name, groups, run_mode=RunMode.RUN))
    except Exception:  # noqa: BLE001 - the group itself is the problem; reported by the caller
        return set()


def _is_group(key: str) -> bool:
    return key in GROUPS or key.startswith("hydra/")


def _nearest(key: str, keys: set[str]) -> str | None:
    # Only a key at the same depth is a likely typo: task.model.width is no misspelt task.module.
    match = difflib.get_close_matches(key, sorted(k for k in keys if k.count(".") == key.count(".")), n=1,
                                      cutoff=0.6)
    return match[0] if match else None


def _owned(key: str) -> bool:
    return key.split(".")[0] in OWNED and not any(key == p or key.startswith(p + ".") for p in OPEN)


def _check_key(o: Any, keys: set[str]) -> None:
    key = o.key_or_group
    if _is_group(key) or key.startswith("hydra.") or not keys:
        return
    value = o.input_line.partition("=")[2]
    if o.is_delete():
        if _owned(key) or key in TASK_REQUIRED:
            raise PlanError(f"~{key}", value or None, "removes a key the workers need",
                            f"set a value instead: {key}=<value>")
        return
    if o.is_add() and key in keys:  # Hydra's own refusal names neither the key nor the fix
        raise PlanError(key, value, "already exists, and `+` adds a new key only",
                        f"drop the +: {key}={value} (or ++{key}={value} to set it whether it exists or not)")
    if o.is_add() or o.is_force_add():
        if _owned(key) and key not in keys:
            near = _nearest(key, keys)
            raise PlanError(key, value, f"not a {key.split('.')[0]} setting ddp-run knows"
                            + (f" (did you mean {near}?)" if near else ""),
                            f"use {near}={value}" if near else "remove it (ddp-run --help lists every key)")
        return
    if key.startswith("logger.") and key not in keys and key.count(".") >= 2:
        name = key.split(".")[1]
        raise PlanError(key, value, f"a setting of the {name} logger, which this run does not select",
                        f"select it too, e.g. logger=[tensorboard,{name}] {key}={value}")
    if key not in keys:
        near = _nearest(key, keys)
        raise PlanError(key, value, "no such key" + (f" (did you mean {near}?)" if near else ""),
                        f"use {near}={value}" if near else
                        f"check the name with ddp-run --cfg job, or add a new key of your task's with +{key}={value}")


def _check_sweep_groups(o: Any, loader: Any) -> None:
    """Every value of a swept group must exist (composition only tried the first)."""
    key = o.key_or_group
    if not (_is_group(key) and o.is_sweep_override()):
        return
    options = loader.get_group_options(key)
    for v in o.sweep_string_iterator():
        if v not in options:
            raise PlanError(key, v, f"no such {key}", f"pick one of: {', '.join(sorted(options))}")


def task_fix(option: str, presets: Sequence[str]) -> str:
    """How to run a task that has no preset: its module named directly, or its YAML in a config folder."""
    from ddp_runner.config.task_module import CUSTOM_PRESET, findable

    found = findable(option) if option.isidentifier() else False
    # A folder here that holds the YAML: the user forgot --config-dir.
    here = next((d for d in ("conf", "config", "configs", ".") if os.path.isfile(os.path.join(d, "task",
                                                                                              f"{option}.yaml"))), None)
    module = (f"task.module={option if found else '<your module>'} (a module with build(cfg, device)"
              + (f"; {option} is importable here" if found else "") + ")")
    yaml = (f"--config-dir {here} task={option} ({os.path.join(here, 'task', option)}.yaml is here)" if here else
            f"your YAML as <folder>/task/{option}.yaml, then --config-dir <folder> task={option}")
    first, second = (module, yaml) if found and not here else (yaml, module)  # the likelier way first
    shown = [p for p in presets if p != CUSTOM_PRESET]
    return (f"name your own task either way: {first}, or {second}"
            + (f"; built-in presets: {', '.join(shown)}" if shown else ""))


def _missing(exc: Any, parsed: list[Any], name: str) -> PlanError:
    """A config option or primary config that is not in the search path."""
    missing = (exc.missing_cfg_file or "").strip("/")
    options = sorted(exc.options or [])
    group, _, option = missing.rpartition("/")
    for o in parsed:
        if o.key_or_group == group == "task":
            return PlanError(group, option, "no such task: no task/" f"{option}.yaml in the config search path",
                             task_fix(option, options))
        if o.key_or_group == group:
            return PlanError(group, option, f"no such {group} in the config search path",
                             f"pick one of: {', '.join(options)}" if options else
                             f"add {group}/{option}.yaml to a --config-dir folder")
    if missing == name or not group:
        return PlanError("--config-name", name, "no such primary config in the config search path",
                         "point --config-dir at the folder holding it (e.g. a run directory's config.yaml)")
    return PlanError(group or "config", option or missing, str(exc).strip().splitlines()[0],
                     f"pick one of: {', '.join(options)}" if options else "check the defaults list")
