"""Print the interpreter ``make`` builds ``.venv`` from on a CPU host: the one running this (``python3``), or the
distribution's build of the same Python version where this one was configured without ``--enable-optimizations``
(pyenv's default build: no profile-guided or link-time optimisation, libpython loaded as a shared library). The
distribution's build (``/usr/bin/python3.X``: PGO, LTO, libpython linked in) imports torch about a fifth faster,
and every agent, rank and driver the runner starts imports it (BENCHMARKS.md: the test suite).
``make PYTHON=...`` chooses another."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig


def venv_python() -> str:
    """The path of the interpreter to make ``.venv`` from (see the module's docstring)."""
    me = sys.executable
    if "--enable-optimizations" in (sysconfig.get_config_var("CONFIG_ARGS") or ""):
        return me
    distro = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.access(distro, os.X_OK) or os.path.realpath(distro) == os.path.realpath(me):
        return me
    # Able to make a venv with pip in it (Debian splits venv and ensurepip off).
    ok = subprocess.run([distro, "-c", "import ensurepip, venv"], capture_output=True, timeout=60).returncode == 0
    return distro if ok else me


if __name__ == "__main__":
    print(venv_python())
