"""launcher=kubernetes, the checks of what the user gives for the pods: their variables (none the operators set,
secrets apart), their resources (Kubernetes quantities), the folder the manifests go to.

Refusals name the key as the user gave it and say how to fix it (exit 2, before anything is written).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddp_runner.contract.errors import PlanError

# What the operators (and the manifests) set on every pod: a value of the user's would be refused by Trainer v2's
# admission, silently overridden by Training Operator v1, or (POD_IP) written twice, which makes both files invalid.
RESERVED_PREFIXES = ("PET_",)
RESERVED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
            "POD_IP")
# A variable whose name says it holds a credential: its value reaches the pods only through a Secret.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_KEY|PRIVATE_KEY", re.IGNORECASE)
# A Kubernetes resource quantity (resource.Quantity): a number, with a decimal or binary suffix.
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<unit>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][0-9]+)?$")


def check_env(env: Mapping[str, Any]) -> None:
    """Refuse a variable the operators or the manifests set themselves."""
    for name in env:
        if str(name).startswith(RESERVED_PREFIXES) or str(name) in RESERVED:
            raise PlanError(f"launcher.env.{name}", env[name], "is set on every pod by the Kubeflow operator or by"
                            " the manifests (PET_*, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, POD_IP): Trainer v2"
                            " refuses the job, Training Operator v1 overrides it",
                            f"leave {name} out of launcher.env; the plan's own keys set it (launcher.nodes,"
                            " world_size, launcher.local_addr)")


def check_resources(launcher: Mapping[str, Any]) -> None:
    """``cpu_per_node`` and ``memory_per_node`` must be positive Kubernetes quantities (e.g. 16, 500m, 64Gi)."""
    for key, example in (("cpu_per_node", "16 or 500m"), ("memory_per_node", "64Gi")):
        value = launcher.get(key)
        if value is None:
            continue
        m = _QUANTITY.match(str(value).strip()) if not isinstance(value, bool) else None
        if m is None or float(m.group("num")) <= 0:
            raise PlanError(f"launcher.{key}", value, "is not a positive Kubernetes quantity",
                            f"e.g. launcher.{key}={example}, or launcher.{key}=null for none")


def manifest_folder(launcher: Mapping[str, Any], job_name: str) -> Path:
    """``<manifest_dir>/<job_name>``, made (owner-only where it is new: a Secret may be written in it)."""
    given = str(launcher.get("manifest_dir") or "kubernetes")
    folder = Path(given, job_name)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = folder / ".ddp-run-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise PlanError("launcher.manifest_dir", given, f"cannot hold the manifests: {err.strerror or err}",
                        "give a folder you can write, e.g. launcher.manifest_dir=kubernetes") from None
    return folder


def secret_names(env: Mapping[str, Any], written: Mapping[str, Any] | None) -> list[str]:
    """The variables of ``launcher.env`` that hold a secret: a value from the environment (``${oc.env:…}``, which
    config.yaml keeps as its text: ``written`` differs from the value), or one whose name says so."""
    kept = written or {}
    return [str(k) for k, v in env.items()
            if SECRET_NAME.search(str(k)) or (str(k) in kept and str(kept[k]) != str(v))]
