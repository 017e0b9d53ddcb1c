"""launcher=kubernetes: a ``--config-dir`` of the command line, carried to the pods.

The pods compose their config from the image's package; a config group of the user's own (``task=mytask`` from
``--config-dir conf``) would be unknown to them. So the config dir's files travel in a ConfigMap written beside the
job, mounted read-only in every pod, and the pods' command names it: ``ddp-run --config-dir <mount> …``.
"""

from __future__ import annotations

from pathlib import Path

from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import kube_manifest as km

MAX_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, its keys and metadata included
SUFFIXES = (".yaml", ".yml")


def given_dir() -> str | None:
    """The ``--config-dir`` of this command line (Hydra's command-line config source), or None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    for source in HydraConfig.get().runtime.config_sources:
        if source.provider == "command-line":
            return str(source.path).removeprefix("file://")
    return None


def files(folder: str) -> dict[str, str]:
    """The config dir's YAML files, ``{path relative to it: text}`` (refused when a ConfigMap cannot hold them)."""
    root = Path(folder)
    found = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
             if p.is_file() and p.suffix in SUFFIXES}
    size = sum(len(t.encode()) + len(k) for k, t in found.items())
    if size > MAX_BYTES:
        raise PlanError("--config-dir", folder, f"holds {size // 1024} KiB of YAML, more than the ConfigMap that"
                        " carries it to the pods can (1 MiB)", "keep only the configs this job needs in the dir,"
                        " or install them in the image and leave --config-dir out")
    return found


def pod_prefix(config_files: dict[str, str]) -> list[str]:
    """What the pods' ``ddp-run`` gets before the overrides: the mounted config dir, when there is one."""
    return ["--config-dir", km.CONF_MOUNT] if config_files else []
