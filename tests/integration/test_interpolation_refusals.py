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


@pytest.mark.parametrize("value", ["${now:}", "${oc.env:NOPE_X}"])
def test_a_failing_interpolation_a_later_override_replaces_runs(value: str, out_root: Path, cli,
                                                                monkeypatch: pytest.MonkeyPatch):
    """Issue 51 item 6: the later override wins, as Hydra composes it; reading Hydra's record of the overrides
    must not resolve the one it replaced."""
    monkeypatch.delenv("NOPE_X", raising=False)
    r = cli([f"train.lr={value}", "train.lr=0.125", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dry run" in r.stdout and "train.lr=0.125" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr and "InterpolationResolutionError" not in r.stderr


@pytest.mark.parametrize("where", ["task/mine.yaml", "config.yaml"])
def test_a_malformed_interpolation_in_a_config_file_is_refused_naming_key_and_file(
        where: str, tmp_path: Path, out_root: Path, cli):
    """Issue 51 item 6: ``lr: ${oc.env:"A}`` in a ``--config-dir`` file cannot be parsed: a refusal naming the
    key and the file, exit 2 (it was three chained tracebacks ending in IndexError)."""
    folder = tmp_path / "confs"
    (folder / "task").mkdir(parents=True)
    if where == "config.yaml":  # the primary config: the package's, with a key of its own spoilt
        (folder / "config.yaml").write_text("defaults:\n  - ddp_runner_config\n  - _self_\n"
                                            "train:\n  lr: ${oc.env:\"A}\n")
        (folder / "ddp_runner_config.yaml").write_text(
            (Path(__file__).parents[2] / "conf" / "config.yaml").read_text())
        args = ["--config-dir", str(folder)]
    else:
        (folder / where).write_text("# @package _global_\ndefaults:\n  - smoke\ntrain:\n  lr: ${oc.env:\"A}\n")
        args = ["--config-dir", str(folder), "task=mine"]
    r = cli([*args, "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "key:   train.lr" in r.stderr and "its interpolation cannot be parsed" in r.stderr, r.stderr
    assert f"in {folder / where}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "IndexError" not in r.stderr
    assert not out_root.exists()


def test_a_malformed_interpolation_on_the_command_line_names_the_key(out_root: Path, cli):
    r = cli(["train.lr=${oc.env:\"A}", "device=cpu", "dry_run=true"], out_root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "key:   train.lr" in r.stderr and "value: '${oc.env:\"A}'" in r.stderr, r.stderr
