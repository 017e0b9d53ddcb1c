"""Issue 45 item 4 through ``ddp_runner.cli.main()`` in this process: ``'train.lr=${now:}'`` and
``'train.lr=${oc.env:NOPE_X}'`` (unset) used to end in Hydra's traceback, exit 1; each is now a refusal, exit 2,
naming the key and the fix, with no run directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("value, says", [
    ("${now:}", "its interpolation cannot be resolved"),
    ("${oc.env:NOPE_X}", "takes its value from the environment variable NOPE_X, which is not set"),
])
def test_an_interpolation_that_fails_is_refused_naming_the_key(value: str, says: str, out_root: Path, cli,
                                                               monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NOPE_X", raising=False)
    r = cli([f"train.lr={value}", "device=cpu"], out_root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"ddp-run: refused: train.lr={value!r}: {says}" in r.stderr
    assert "key:   train.lr" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr and "InterpolationResolutionError" not in r.stderr
    assert not out_root.exists()


def test_a_sweep_with_one_is_refused_too(out_root: Path, cli, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NOPE_X", raising=False)
    r = cli(["-m", "train.lr=${oc.env:NOPE_X}", "world_size=1,2", "device=cpu"], out_root)
    assert r.returncode == 2 and "key:   train.lr" in r.stderr, r.stdout + r.stderr
    assert not out_root.exists()
