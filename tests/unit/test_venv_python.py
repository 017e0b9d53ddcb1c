"""tools/venv_python.py: the interpreter `make` builds .venv from."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tools import venv_python


def test_the_choice_is_this_python_version_and_makes_a_venv() -> None:
    chosen = venv_python.venv_python()
    r = subprocess.run([chosen, "-c", "import sys, venv, ensurepip; print(sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(tuple(sys.version_info[:2])), r.stderr


def test_an_optimised_build_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var",
                        lambda k: "'--enable-optimizations' '--with-lto'" if k == "CONFIG_ARGS" else real(k))
    assert venv_python.venv_python() == sys.executable


def test_an_unoptimised_build_gives_way_to_the_distributions(monkeypatch: pytest.MonkeyPatch) -> None:
    distro = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not distro.exists():
        pytest.skip(f"no {distro} on this host")
    monkeypatch.setattr(sysconfig, "get_config_var", lambda k: "'--enable-shared'" if k == "CONFIG_ARGS" else None)
    monkeypatch.setattr(sys, "executable", "/opt/elsewhere/bin/python3")
    ok = subprocess.run([str(distro), "-c", "import ensurepip, venv"], capture_output=True).returncode == 0
    assert venv_python.venv_python() == (str(distro) if ok else "/opt/elsewhere/bin/python3")
