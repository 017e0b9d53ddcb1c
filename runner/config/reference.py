"""The config reference, generated from the validation table so that it never drifts: each key's type and
allowed values come from its :class:`~ddp_runner.contract.rules.Rule` (runner/config/validate.py), its one line from
:data:`~ddp_runner.config.key_docs.KEY_DOCS`, and each preset's line from the first sentence of the comment that opens
its YAML. ``ddp-run --help`` prints it as text; ``python -m ddp_runner.config.reference > docs/config.md`` writes the
docs page (a test fails when the committed page is stale).

Pure apart from reading the preset YAMLs, and composing the config (Hydra) for the values it shows.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_runner.config import overrides as ov
from ddp_runner.config.key_docs import KEY_DOCS
from ddp_runner.config.validate import DATA_RULES, ENGINE_RULES
from ddp_runner.contract.rules import Rule, flatten

GROUPS = ("task", "data", "strategy", "launcher", "logger", "experiment")
_KINDS = {"int": "int", "number": "float", "bool": "bool", "str": "string", "choice": "choice",
          "numbers": "list", "mapping": "mapping", "signal": "signal"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def table_rules() -> list[Rule]:
    """Every rule of the validation table, engine keys first, then each data key once."""
    seen: dict[str, Rule] = {}
    for rule in (*ENGINE_RULES, *(r for rules in DATA_RULES.values() for r in rules)):
        seen.setdefault(rule.key, rule)
    return list(seen.values())


def kind(rule: Rule) -> str:
    """The key's type as a user reads it (``int``, ``float``, ``bool``, ``list``…)."""
    return _KINDS.get(rule.kind, rule.kind)


def allowed(rule: Rule) -> str:
    """The values a rule accepts, in words: ``auto, cpu, cuda``; ``>= 1, or auto``; ``2 numbers, >= 0 and < 1``."""
    if rule.kind == "choice":
        text = ", ".join(str(c) for c in rule.choices)
    elif rule.kind == "bool":
        text = "true, false"
    elif rule.kind in ("int", "number", "numbers"):
        bounds = [f"{'>' if rule.lo_open else '>='} {_num(rule.lo)}"] if rule.lo is not None else []
        bounds += [f"{'<' if rule.hi_open else '<='} {_num(rule.hi)}"] if rule.hi is not None else []
        text = " and ".join(bounds) or "any"
        if rule.kind == "numbers":
            text = f"{rule.length} numbers, each {text}"
        if rule.choices:
            text += ", or " + ", ".join(str(c) for c in rule.choices)
    elif rule.kind == "mapping":
        text = "key: value settings"
    elif rule.kind == "signal":
        text = "a signal name or number (not SIGUSR1, SIGINT, SIGKILL, SIGSTOP)"
    else:
        text = "non-empty text"
    return text + (", or null" if rule.null else "")


def show(value: Any) -> str:
    """A value as it is written on the command line (``null``, ``true``, ``[0.9, 0.95]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def first_sentence(yaml_text: str, limit: int = 240) -> str:
    """The first sentence of the comment that opens a preset's YAML (``# @package`` lines skipped)."""
    lines = []
    for line in yaml_text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        body = stripped.lstrip("#").strip()
        if body.startswith("@package"):
            continue
        if not body:
            break
        lines.append(body)
    sentence = _SENTENCE_END.split(" ".join(lines), maxsplit=1)[0]
    return sentence if len(sentence) <= limit else sentence[:limit - 1].rstrip() + "…"


def presets(conf_dirs: Iterable[Path]) -> dict[str, dict[str, str]]:
    """``{group: {option: its one line}}`` over the config folders (the first folder holding an option wins)."""
    out: dict[str, dict[str, str]] = {g: {} for g in GROUPS}
    for conf in conf_dirs:
        for group in GROUPS:
            folder = Path(conf) / group
            for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
                out[group].setdefault(path.stem, first_sentence(path.read_text()) or "(no description)")
    return {g: dict(sorted(opts.items())) for g, opts in out.items() if opts}


def other_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """The composed config's keys that the table does not hold (launcher, task, watchdog, fault… keys, checked by
    their own code), with their values."""
    known = {r.key for r in table_rules()}
    return {k: v for k, v in values.items()
            if k not in known and not any(k.startswith(p + ".") for p in known)}


def help_text(conf_dirs: Iterable[Path], values: Mapping[str, Any]) -> str:
    """``ddp-run --help``: usage, each preset with its line, each key with type, allowed values, current value
    and its line; ``values``: the composed config, flattened (``{}`` when it could not be composed)."""
    out = [_USAGE, "Presets (pick one per group with group=option):"]
    for group, options in presets(conf_dirs).items():
        out.append(f"  {group}:")
        out += [f"    {name:<20} {_short(line)}" for name, line in options.items()]
    out += ["", "Keys (key=value): type, allowed values, value now, what it does:"]
    out += [key_lines(rule, values) for rule in table_rules()]
    extra = other_keys(values)
    if extra:
        out += ["", "Other keys of this config (checked by the task, the launcher or the diagnostics):"]
        out += [f"  {k} = {show(v)}" for k, v in extra.items()]
    out += ["", _FOOTER]
    return "\n".join(out)


def key_lines(rule: Rule, values: Mapping[str, Any]) -> str:
    """One key as ``--help`` shows it: its name and value now, then its type, allowed values and what it does."""
    now = f" = {show(values[rule.key])}" if rule.key in values else ""
    return f"  {rule.key}{now}\n      {kind(rule)}: {allowed(rule)}. {KEY_DOCS.get(rule.key, '')}"


def _under(key: str, name: str) -> bool:
    return key == name or key.startswith(name + ".")


def named_help(names: Sequence[str], conf_dirs: Iterable[Path], values: Mapping[str, Any]) -> tuple[str, list[str]]:
    """``ddp-run --help NAME…``: for each name, a key's lines as the whole help shows them, or for a group
    (``train``, ``task``) its presets and every key under it. Returns the text and the names that name nothing."""
    groups, extra, out, unknown = presets(conf_dirs), other_keys(values), [], []
    for name in names:
        lines = []
        if name in groups:
            lines.append(f"  {name} (pick one with {name}=option):")
            lines += [f"    {option:<20} {_short(line)}" for option, line in groups[name].items()]
        lines += [key_lines(rule, values) for rule in table_rules() if _under(rule.key, name)]
        others = [f"    {k} = {show(v)}" for k, v in extra.items() if _under(k, name)]
        lines += ["  checked by the task, the launcher or the diagnostics:", *others] if others else []
        out += lines
        if not lines:
            unknown.append(name)
    return "\n".join(out), unknown


def known_names(conf_dirs: Iterable[Path], values: Mapping[str, Any]) -> list[str]:
    """Every name ``--help NAME`` answers: the groups, the keys and each key's enclosing names (``train``)."""
    keys = [r.key for r in table_rules()] + list(other_keys(values))
    parents = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    return sorted(set(presets(conf_dirs)) | set(keys) | parents)


def markdown(conf_dirs: Iterable[Path], values: Mapping[str, Any]) -> str:
    """docs/config.md: the same reference as tables (``values``: the default config, flattened)."""
    out = ["# Config reference", "",
           "Generated from the validation table (`runner/config/validate.py`, `runner/config/key_docs.py`) and the",
           "presets' YAML by `python -m ddp_runner.config.reference > docs/config.md`; a test fails when this page is",
           "stale. `ddp-run --help` prints the same, with the values of the config your overrides compose;",
           "`ddp-run --help train.lr` prints only that key, `ddp-run --help train` every `train.*` key.", "",
           "## Presets", "", "Pick one per group with `group=option`, e.g. `ddp-run task=gpt strategy=zero1`.", ""]
    for group, options in presets(conf_dirs).items():
        out += [f"### {group}", "", "| option | what it is |", "| --- | --- |"]
        out += [f"| `{name}` | {_cell(line)} |" for name, line in options.items()]
        out.append("")
    out += ["## Keys", "", "Set any key with `key=value`; these are checked before launch (a bad value is refused "
            "with exit 2, naming the key, the value and the fix).", "",
            "| key | type | allowed | default | what it does |", "| --- | --- | --- | --- | --- |"]
    for rule in table_rules():
        default = f"`{show(values[rule.key])}`" if rule.key in values else ""
        out.append(f"| `{rule.key}` | {kind(rule)} | {_cell(allowed(rule))} | {default} | "
                   f"{_cell(KEY_DOCS.get(rule.key, ''))} |")
    out += ["", _DERIVED]
    out += ["", "## Other keys", "", "Keys of the default config (`task=smoke`) that the task, the launcher or the",
            "diagnostics check themselves:", "", "| key | default |", "| --- | --- |"]
    out += [f"| `{k}` | `{show(v)}` |" for k, v in other_keys(values).items()]
    return "\n".join(out) + "\n"


def _short(line: str, limit: int = 96) -> str:
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


def conf_dirs(config_dir: str | None, config_path: str | None = None) -> list[Path]:
    """The config folders on the search path: the user's ``--config-dir`` first, then the package's."""
    if config_path is None or config_path.startswith("pkg://"):
        package = Path(str(importlib.resources.files("ddp_runner.conf")))
    else:
        package = Path(config_path)
    return ([Path(config_dir)] if config_dir else []) + [package]


def compose_values(args: list[str], config_path: str | None = None) -> dict[str, Any]:
    """The config this command line composes, flattened (``{}`` when it cannot be composed: the help still
    lists every key, without values)."""
    from omegaconf import OmegaConf

    path = config_path or str(conf_dirs(None)[-1])
    cli = ov.parse(without_info(args))
    try:
        if cli.config_dir is not None:  # as the run composes it: a folder with a primary config comes first
            args, path = ov.user_dir_first(without_info(args), cli.config_dir, cli.config_name, path)
            cli = ov.parse(args)
        tree = OmegaConf.to_container(ov.compose(cli, path), resolve=True)
    except Exception:  # noqa: BLE001 - a bad override: the run itself says why; the help stays useful
        return {}
    tree.pop("hydra", None)
    return flatten(tree)


INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def without_info(args: list[str]) -> list[str]:
    """The command line without the options that ask for information (``--cfg job``, ``--info all``, ``--help``)."""
    out: list[str] = []
    for i, a in enumerate(args):
        before = args[i - 1] if i else ""
        if before in ("--cfg", "-c", "--package", "-p") or (before in ("--info", "-i") and a in INFO_CHOICES):
            continue
        if a in ("--cfg", "-c", "--package", "-p", "--info", "-i", "-h", "--help", "--resolve"):
            continue
        if not a.startswith(("--cfg=", "--package=", "--info=")):
            out.append(a)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


_USAGE = """\
ddp-run: plan, validate and launch a torchrun job from a Hydra config.

Usage:
  ddp-run [group=option ...] [key=value ...]   one run, e.g. ddp-run task=smoke world_size=2 device=cpu
  ddp-run -m key=a,b ...                       a sweep: one run per combination (ddp-run -m world_size=1,2)
  ddp-run ... dry_run=true                     print the plan and the command that launches it; launch nothing
  ddp-run ... --cfg job                        print the composed config (and what the runner derives from it)
  ddp-run --help KEY|GROUP ...                 only those keys (--help train.lr), or a group's (--help train)
  ddp-run --info [defaults|searchpath|...]     Hydra's view of the config search path and defaults
  ddp-run task=NAME --config-dir DIR           your own task: DIR/task/NAME.yaml (or task.module=your.module)
  ddp-run --hydra-help                         Hydra's own options
"""

_DERIVED = """\
## Values the runner derives

Some values are decided after composition, when the plan is made: `batch.accumulation` when `batch.global` is
set, `batch.per_rank=auto` (the largest micro-batch that fits the device, the global batch unchanged: see
docs/performance.md), `world_size=auto` (one rank per visible GPU), `device=auto` and `backend=auto`. The run
directory's `config.yaml` holds the decided values (`batch.per_rank=auto` stays `auto` there: run.json's `plan`
records the micro-batch). `--cfg job` prints the composed config as Hydra made it and then, as YAML comments,
what the runner derives from it; `dry_run=true` prints the whole plan:

```
$ ddp-run --cfg job batch.global=32 device=cpu
…
# ddp-run derives these after composition (the run uses them, not the values above):
#   batch.accumulation: 2   (batch.global 32 / (8 per rank × 2 ranks); global batch 32)
#   backend: gloo
```"""

_FOOTER = """\
Run directories land under output.root (default ./outputs): config.yaml, run.json, logs/, tb/, checkpoints/,
summary.json. Open the curves with: tensorboard --logdir outputs
Shell completion: eval "$(ddp-run -sc install=bash)" in ~/.bashrc (zsh: the same after
`autoload -U bashcompinit && bashcompinit`; fish: ddp-run -sc install=fish | source)
Full reference: docs/config.md in the source repository (the same tables, as a page)"""


def _main() -> None:
    """Print docs/config.md for the checkout's (or the installed) configs."""
    print(markdown(conf_dirs(None), compose_values([], None)), end="")


if __name__ == "__main__":
    _main()
