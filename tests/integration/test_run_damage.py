"""A damaged run directory (issue 30): every command that reads one refuses in one line (exit 2, the file, what is
wrong, the fix) or reads what it can, never a traceback and never a wrong ``completed``.

One run tree is made once (the session's ``smoke_reference``, a completed 8-step run) and copied; each case damages
a copy and calls the readers in this process: ``ddp-runs`` (listing, ``show``, ``--json``), ``ddp-compare`` and
``ddp-run resume=…`` (a continued run and a new run from a checkpoint, both as dry runs, through the job's
``execute``: no Hydra composition, nothing launched).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_runner.contract import layout
from ddp_runner.job import execute as job
from ddp_runner.report import compare, runs

# The files of a run tree a reader may open (state.pt is the workers' to verify, by its sha256).
FILES = (layout.MANIFEST, layout.SUMMARY, layout.CONFIG, "checkpoints/step_8/meta.json", "checkpoints/step_6/meta.json",
         "logs/progress/rank0.json", "driver.json")


def _copy(src: Path, dest: Path) -> Path:
    """A private copy of the reference run, laid out under an output root like the original."""
    run = dest / "outputs" / "2026-12-01" / src.name
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("state.pt"))
    for ckpt in ("step_6", "step_8"):  # the driver checks only state.pt's size: a sparse file of that size
        size = (src / "checkpoints" / ckpt / "state.pt").stat().st_size
        with open(run / "checkpoints" / ckpt / "state.pt", "wb") as f:
            f.truncate(size)
    return run


def _call(fn, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a reader's main() called here; an exception propagates (a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = fn(*args)
        except SystemExit as exc:
            code = exc.code
    return int(code or 0), out.getvalue(), err.getvalue()


def _recorded_status(run: Path) -> str | None:
    """The status run.json really records (None when it cannot be read as a manifest)."""
    try:
        manifest = json.loads((run / layout.MANIFEST).read_bytes())
        return manifest.get("status") if isinstance(manifest, dict) else None
    except (OSError, ValueError):
        return None


def _resume(run: Path, source: str, composed: dict) -> tuple[int, str, str]:
    """``ddp-run <the run's overrides> resume=<source> dry_run=true`` through the job's execute(): ``composed`` is
    what Hydra composes from that command line (the undamaged run's config); a continued run reads its own."""
    conf = {**copy.deepcopy(composed), "resume": source, "dry_run": True}
    conf["output"]["root"] = str(run.parent.parent)
    return _call(lambda: job.execute(conf, job.Invocation(argv=["ddp-run", f"resume={source}"],
                                                          overrides=[f"resume={source}", "dry_run=true"])).code)


def read_everything(run: Path, out: Path) -> dict[str, tuple[int, str, str]]:
    """Every reading command on ``run``: name -> (exit code, stdout, stderr)."""
    root = run.parent.parent
    composed = _COMPOSED[0]
    return {
        "ddp-runs": _call(runs.main, [str(root), "--json"]),
        "ddp-runs show": _call(runs.main, ["show", str(run)]),
        "ddp-runs show --json": _call(runs.main, ["show", str(run), "--json"]),
        "ddp-compare": _call(compare.main, [str(run), "--out", str(out)]),
        "resume run": _resume(run, str(run), composed),
        "resume checkpoint": _resume(run, str(run / "checkpoints" / "step_8"), composed),
        "resume last": _resume(run, "last", composed),
    }


def check_truthful(run: Path, results: dict[str, tuple[int, str, str]]) -> None:
    """No traceback; a refusal is one line naming a file; ``completed`` only where run.json records it."""
    recorded = _recorded_status(run)
    for name, (code, out, err) in results.items():
        assert "Traceback" not in out + err, (name, err)
        assert code in (0, 2), (name, code, err)
        if name.startswith("ddp-") and code == 2:
            assert len(err.strip().splitlines()) == 1 and "Fix:" in err, (name, err)
    code, out, _ = results["ddp-runs"]
    for row in json.loads(out)["runs"] if code == 0 else []:
        assert row["status"] != layout.STATUS_COMPLETED or recorded == layout.STATUS_COMPLETED, row
    code, out, _ = results["ddp-runs show --json"]
    if code == 0:
        assert json.loads(out)["status"] != layout.STATUS_COMPLETED or recorded == layout.STATUS_COMPLETED
    code, out, _ = results["ddp-compare"]
    if code == 0:
        assert ("| completed |" not in out) or recorded == layout.STATUS_COMPLETED, out
    # A completed run is never continued (only refused: "completed all its steps"), however damaged its other files.
    code, out, err = results["resume run"]
    assert code == 2 or recorded != layout.STATUS_COMPLETED, (out, err)
    code, out, err = results["resume last"]  # the only run is completed, or damaged: nothing to continue
    assert code == 2 or recorded not in (layout.STATUS_COMPLETED, None), (out, err)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare, "plots", lambda runs, table, out: [])  # drawing PNGs reads nothing


_COMPOSED: list[dict] = []  # the reference run's config: what its command line composes


@pytest.fixture(scope="module")
def pristine(smoke_reference: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _COMPOSED[:] = [yaml.safe_load((smoke_reference / layout.CONFIG).read_text())]
    return _copy(smoke_reference, tmp_path_factory.mktemp("pristine"))


@pytest.mark.parametrize(("rel", "content", "where"), [
    (layout.CONFIG, b"train: [unclosed\n", "config.yaml"),  # hand-edited into invalid YAML
    (layout.CONFIG, b"[]\n", "config.yaml"),  # a list, not the config mapping
    (layout.MANIFEST, b'{"status": "comp', "run.json"),  # truncated
    (layout.SUMMARY, b"\x00\x17garbage\xff", "summary.json"),
])
def test_damaged_file_one_line_refusal(pristine: Path, tmp_path: Path, rel: str, content: bytes, where: str) -> None:
    """The cases of the trial: each reader that needs the file refuses with one line naming it and the fix."""
    run = _copy(pristine, tmp_path)
    (run / rel).write_bytes(content)
    results = read_everything(run, tmp_path / "cmp")
    check_truthful(run, results)
    code, _, err = results["resume run"]
    assert code == 2 and where in err and "is damaged" in err and "fix:" in err, err
    if rel != layout.CONFIG:  # ddp-compare reads config.yaml only for the config difference
        code, _, err = results["ddp-compare"]
        assert code == 2 and where in err and "Fix:" in err, err
    if rel == layout.MANIFEST:  # ddp-runs show names the file and how to recover; the listing skips it, saying why
        code, _, err = results["ddp-runs show"]
        assert code == 2 and "run.json: damaged" in err and "resume=" in err, err
        code, _, err = results["ddp-runs"]
        assert code == 0 and "skipped" in err and "run.json" in err, err


_DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 1.0)),
    st.tuples(st.just("flip"), st.floats(0.0, 1.0), st.integers(0, 255)),
    st.tuples(st.just("replace"), st.binary(max_size=40)),
)


def _damage(path: Path, how: tuple) -> None:
    data = path.read_bytes()
    if how[0] == "truncate":
        path.write_bytes(data[: int(len(data) * how[1])])
    elif how[0] == "flip" and data:
        i = min(len(data) - 1, int(len(data) * how[1]))
        path.write_bytes(data[:i] + bytes([how[2]]) + data[i + 1:])
    elif how[0] == "replace":
        path.write_bytes(how[1])


@settings(max_examples=60, deadline=20_000, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damage=st.lists(st.tuples(st.sampled_from(FILES), _DAMAGE), min_size=1, max_size=2))
def test_any_damage_reads_truthfully(pristine: Path, tmp_path: Path, damage: list) -> None:
    """Random truncation or corruption of files of a run tree: every reader ends in 0 or a one-line refusal."""
    case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    run = _copy(pristine, case)
    for rel, how in damage:
        _damage(run / rel, how)
    check_truthful(run, read_everything(run, case / "cmp"))


# -- settings changed on resume, refused before launch (issue 30) ----------------------------------------------------

SMOKE = ["task=smoke", "device=cpu", "world_size=2"]


@pytest.mark.parametrize(("args", "key", "why"), [
    ([*SMOKE, "train.lr=0.5"], "train.lr", "the learning rate comes from the restored schedule state"),
    ([*SMOKE, "task.in_features=4"], "task.in_features", "weights fit only the model"),
    ([*SMOKE, "train.optimizer=adamw"], "train.optimizer", "belongs to that optimizer"),
])
def test_resume_from_a_checkpoint_refuses_a_fixed_setting(pristine: Path, tmp_path: Path, cli, args, key, why
                                                          ) -> None:
    run = _copy(pristine, tmp_path)
    r = cli([*args, f"resume={run}/checkpoints/step_6"], tmp_path / "new")
    assert r.returncode == 2 and f"refused: {key}=" in r.stderr and why in r.stderr, r.stderr
    assert "differs from the checkpoint's run" in r.stderr and "docs/resume.md" in r.stderr
    assert not (tmp_path / "new").exists()


def test_resume_from_a_checkpoint_applies_other_settings(pristine: Path, tmp_path: Path, cli) -> None:
    run = _copy(pristine, tmp_path)
    r = cli([*SMOKE, "train.grad_clip=1.0", "checkpoint.keep_last=0", f"resume={run}/checkpoints/step_6",
             "dry_run=true"], tmp_path / "new")
    assert r.returncode == 0, r.stderr
    assert "changed on resume: " in r.stdout and "train.grad_clip None -> 1.0" in r.stdout, r.stdout
    assert "checkpoint.keep_last 2 -> 0" in r.stdout and "(from step 6)" in r.stdout


@pytest.mark.parametrize(("extra", "expect"), [
    (["train.lr=0.5"], "differs from the run's own config.yaml (0.01), and cannot change on resume"),
    (["task.model.width=128"], "takes its task and model from the checkpoint's run"),
])
def test_continuing_a_run_refuses_a_fixed_setting(pristine: Path, tmp_path: Path, cli, extra, expect) -> None:
    run = _copy(pristine, tmp_path)
    r = cli([f"resume={run}", *extra], tmp_path / "unused")
    assert r.returncode == 2 and expect in r.stderr, r.stderr
    assert "task.module=128" not in r.stderr
