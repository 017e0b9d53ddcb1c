"""The bytecode cache for the driver's children where torch has none (runner/config/bytecode.py)."""

from __future__ import annotations

import py_compile
import subprocess
import sys
from pathlib import Path


def _package(root, name, compiled):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    if compiled:
        py_compile.compile(str(pkg / "__init__.py"), doraise=True)
    return pkg


def test_the_cache_is_filled_once_and_read_after(tmp_path):
    # What a child does with that environment: the first import writes the bytecode into the cache (not beside
    # the source), the next one reads it.
    _package(tmp_path, "cached_pkg_for_test", compiled=False)
    prefix = tmp_path / "pycache"
    env = {"PYTHONPATH": str(tmp_path), "PYTHONPYCACHEPREFIX": str(prefix)}
    code = "import cached_pkg_for_test, importlib.util as u; print(u.cache_from_source(cached_pkg_for_test.__file__))"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cached = first.stdout.strip()
    assert cached.startswith(str(prefix)) and (tmp_path / "pycache").exists()
    assert not (tmp_path / "cached_pkg_for_test" / "__pycache__").exists()
    assert Path(cached).is_file()
