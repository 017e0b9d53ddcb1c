"""The driver's torch probe (runner/config/probe.py): one subprocess, its answer cached under the output root for the
next job with the same task and model, and nothing written for a refused plan or a dry run.

The dry runs and the refusal end before anything is launched: they call the CLI's ``main()`` in this process
(``cli_in_process``), whose probe is a subprocess as a real driver's (a child of this process instead)."""

from __future__ import annotations

import json
import re

from ddp_runner.config import probe as probe_mod
from tests.support.driver import cli_in_process, ddp_run
from tests.support.run_tree import run_dirs

# The smoke task computes no memory_facts of its own: torch's probe counts its model.
TINY = ["task=smoke", "device=cpu", "world_size=1", "train.max_steps=1", "strategy.memory_cap_gb=100",
        "checkpoint.final=false"]


def _params(stdout: str) -> int:
    """The parameter count a dry run's plan printout records."""
    return int(re.search(r"^  params: (\d+)$", stdout, re.M).group(1))


def test_the_answer_is_cached_for_the_next_job_and_read_from_there(tmp_path, monkeypatch):
    root = tmp_path / "out"
    r = cli_in_process([*TINY, "dry_run=true"], root, monkeypatch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not root.exists(), "a dry run writes nothing under the output root"

    r = ddp_run(TINY, root)
    assert r.returncode == 0, r.stdout + r.stderr
    [cached] = list((root / ".compile_cache" / probe_mod.CACHE_SUBDIR).glob("*.json"))
    answer = json.loads(cached.read_text())
    assert answer["model"]["params"] > 0
    [run] = run_dirs(root)
    first = json.loads((run / "run.json").read_text())["memory_plan"]["params"]
    assert first == answer["model"]["params"] == 9

    # The next job reads the cache instead of probing: a doctored count shows in its plan.
    answer["model"]["params"] *= 2
    cached.write_text(json.dumps(answer))
    r = cli_in_process([*TINY, "dry_run=true"], root, monkeypatch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _params(r.stdout) == 2 * first

    # Another model is another key: probed afresh, and cached beside the first.
    r = ddp_run([*TINY, "task.in_features=16"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list((root / ".compile_cache" / probe_mod.CACHE_SUBDIR).glob("*.json"))) == 2
    assert len(run_dirs(root)) == 2


def test_a_plan_refused_after_the_probe_started_leaves_no_probe_running(tmp_path, monkeypatch):
    import psutil

    # The probe starts (the smoke task has no memory_facts), then the watchdog setting is refused. The driver's
    # environment carries a mark of this test that its probe inherits: probes of other tests running meanwhile
    # (xdist workers, other checkouts on the host) are not this driver's. In process, a probe the driver left would
    # be a child of this process still running: found the same way.
    mark = {"DDP_RUNNER_TEST_MARK": str(tmp_path)}
    r = cli_in_process(["task=smoke", "device=cpu", "strategy.memory_cap_gb=100", "timeout_s=60",
                        "watchdog.timeout_s=90"], tmp_path / "out", monkeypatch, env=mark)
    assert r.returncode == 2 and "watchdog.timeout_s" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()

    def ours(p: psutil.Process) -> bool:
        try:
            return p.environ().get("DDP_RUNNER_TEST_MARK") == str(tmp_path)
        except psutil.Error:
            return False

    probes = [p for p in psutil.process_iter(["cmdline"])
              if "ddp_runner.tasks.engine.driver_probe" in (p.info["cmdline"] or []) and ours(p)]
    assert probes == []
