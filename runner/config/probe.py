"""The driver's one torch subprocess (``ddp_runner.tasks.engine.driver_probe``): started as soon as the config is
checked, so it runs while the driver does the rest of its checks, and its answer kept in the output root's cache so that
the next job with the same task, model and torch skips it (the jobs of a sweep, reruns). It is not started at all when
the driver can answer without torch: ``train.inductor`` keys from torch's config source
(runner/config/inductor_settings.py), a model's counts from its task's ``memory_facts(cfg)`` (task=gpt has one).

The cache key covers everything the answer depends on: the parts asked for, the task, data and ``train.inductor``
sections of the config, the torch version, and the size and time of every source file of the task's package and of
the probe itself (an edited model is probed again).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ddp_runner.config import bytecode
from ddp_runner.contract import layout

CACHE_SUBDIR = "driver-probe"
TIMEOUT_S = 300


class ProbeError(RuntimeError):
    """The probe failed: the last line of its error output."""


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _sources(module: str | None, task_dir: str | None) -> list[str]:
    """The source files an answer depends on: the ``tasks`` package's, and those beside the task's module."""
    # The engine, the probe and the built-in tasks: found by name (tasks/ in a checkout, ddp_runner/tasks/ installed).
    tasks_pkg = importlib.util.find_spec("ddp_runner.tasks")
    files = {str(p) for d in (tasks_pkg.submodule_search_locations or []) for p in Path(d).rglob("*.py")}
    if module:
        if task_dir and task_dir not in sys.path:
            sys.path.append(task_dir)
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            spec = importlib.util.find_spec(module)  # imports the parent packages only (light)
            if spec is not None and spec.origin:
                files.update(str(p) for p in Path(spec.origin).parent.glob("*.py"))
    return sorted(files)


def cache_key(cfg: dict[str, Any], want: list[str], task_dir: str | None) -> str:
    """The key of an answer: what was asked, the config sections it reads, torch's version, the sources."""
    train = cfg.get("train") or {}
    stamp = []
    for path in _sources((cfg.get("task") or {}).get("module"), task_dir):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            stamp.append((path, st.st_size, st.st_mtime_ns))
    material = {"want": sorted(want), "task": cfg.get("task"), "data": cfg.get("data"),
                "inductor": train.get("inductor"), "precision": train.get("precision"), "torch": _torch_version(),
                "python": sys.version, "sources": stamp}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Probe:
    """One request to the probe: from the cache when answered before, else a subprocess started now; its answer is
    cached by :meth:`keep`."""

    def __init__(self, cfg: dict[str, Any], want: list[str], task_dir: str | None, cache_dir: str | None,
                 inductor_keys: list[str] | None = None, known: dict[str, Any] | None = None) -> None:
        """``want``: the parts needed; ``known``: parts the driver answered without torch (not asked again)."""
        self.want = want
        self.known = {k: v for k, v in (known or {}).items() if k in want}
        ask = [w for w in want if w not in self.known]
        self.cache_path = (os.path.join(cache_dir, CACHE_SUBDIR, cache_key(cfg, ask, task_dir) + ".json")
                           if cache_dir and ask else None)
        self.answer: dict[str, Any] | None = None
        self.asked: dict[str, Any] = {}  # what torch answered in this process: the part worth caching
        self.proc: subprocess.Popen[str] | None = None
        self.cached = False
        if not ask:  # nothing for torch to answer: no subprocess, nothing to cache
            self.answer, self.cached = dict(self.known), True
            return
        if self.cache_path:
            with contextlib.suppress(OSError, ValueError, TypeError):  # unreadable: probed again
                self.answer = {**json.loads(Path(self.cache_path).read_text()), **self.known}
                self.cached = True
                return
        env = bytecode.child_env(os.environ)
        if task_dir:
            env[layout.ENV_TASK_PATH] = os.pathsep.join(filter(None, [env.get(layout.ENV_TASK_PATH), task_dir]))
        self.request = json.dumps({"config": cfg, "want": ask, "inductor_keys": inductor_keys or []})
        self.proc = subprocess.Popen([sys.executable, "-m", "ddp_runner.tasks.engine.driver_probe"],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        # The request goes in now (a config is far below a pipe's buffer): the probe works while the driver does.
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.request)
        self.proc.stdin.close()
        self.proc.stdin = None  # communicate() must not flush it again

    def result(self) -> dict[str, Any]:
        """The answer (waits for the subprocess); ProbeError when it failed."""
        if self.answer is not None:
            return self.answer
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            self.cancel()
            raise ProbeError(f"the driver's torch probe took longer than {TIMEOUT_S} s") from exc
        if self.proc.returncode != 0:
            tail = (err.strip().splitlines() or ["no output"])[-1]
            raise ProbeError(tail)
        try:
            self.answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise ProbeError(f"unreadable answer: {out[-200:]!r}") from exc
        self.asked = dict(self.answer)
        self.answer.update(self.known)
        return self.answer

    def cancel(self) -> None:
        """Stop the subprocess (the answer is not needed: the plan was refused first)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def keep(self) -> None:
        """Store a fresh answer in the cache. Called once the run directory exists: a refused plan or a dry run
        creates nothing under the output root."""
        if not self.cache_path or self.cached or not self.asked:
            return
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next job the probe
            folder = os.path.dirname(self.cache_path)
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.asked, f)
            os.replace(tmp, self.cache_path)
