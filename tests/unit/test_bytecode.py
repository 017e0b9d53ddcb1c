"""The bytecode cache for the driver's children where torch has none (runner/config/bytecode.py)."""

from __future__ import annotations

import py_compile

from ddp_runner.config import bytecode


def _package(root, name, compiled):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    if compiled:
        py_compile.compile(str(pkg / "__init__.py"), doraise=True)
    return pkg


def test_a_package_without_bytecode_is_told_apart(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _package(tmp_path, "bare_pkg_for_test", compiled=False)
    _package(tmp_path, "compiled_pkg_for_test", compiled=True)
    assert bytecode.lacks_bytecode("bare_pkg_for_test")
    assert not bytecode.lacks_bytecode("compiled_pkg_for_test")
    assert not bytecode.lacks_bytecode("no_such_pkg_for_test")


def test_children_get_the_cache_only_where_torch_lacks_bytecode(monkeypatch):
    env = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/home/u"}
    monkeypatch.setattr(bytecode, "lacks_bytecode", lambda package="torch": True)
    out = bytecode.child_env(env)
    assert out["PYTHONPYCACHEPREFIX"].endswith("/.cache/ddp-runner/pycache") and "PYTHONDONTWRITEBYTECODE" not in out
    assert env == {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/home/u"}, "the driver's own environment is unchanged"
    # The user's own prefix wins, with their other settings.
    assert bytecode.child_env({**env, "PYTHONPYCACHEPREFIX": "/mine"}) == {**env, "PYTHONPYCACHEPREFIX": "/mine"}
    monkeypatch.setattr(bytecode, "lacks_bytecode", lambda package="torch": False)
    assert bytecode.child_env(env) == env
