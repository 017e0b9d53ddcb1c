"""Resume sources refused before launch, through the CLI's main() in this process (nothing is launched, so no new
interpreter): another model width or world size than the checkpoint's run, a source that does not exist, and a
directory that holds no complete checkpoint. Each exits 2, says "Nothing was started" and leaves no run directory.
(Moved from tests/e2e/test_resume.py; the exit code of a real ``ddp-run`` refusal is proven end to end by
test_resume_fallback_e2e.py, test_remote.py and test_probe_e2e.py.)
"""

from __future__ import annotations

from pathlib import Path

from tests.support.recipes import SMOKE_CKPT2, gpt_dropout_args


def test_incompatible_resume_is_refused(tmp_path, text_file, gpt_dropout_reference, cli):
    args = gpt_dropout_args(text_file)
    source = f"{gpt_dropout_reference}/checkpoints/step_4"  # a checkpoint of 2 ranks, model width 64

    # Another model width: refused by the driver from the checkpoint's run's config, before anything starts
    # (issue 30; the workers' state-dict comparison stays as the last line of defence).
    r = cli([*args, f"resume={source}", "task.model.width=32"], tmp_path / "width")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "task.model.width=32: differs from the checkpoint's run (64)" in r.stderr, r.stderr
    assert "cannot change on resume" in r.stderr and "Nothing was started" in r.stderr
    assert not (tmp_path / "width").exists()

    # Another world size: refused by the driver, before anything starts.
    r = cli([*args, f"resume={source}", "world_size=1"], tmp_path / "ws")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "world_size=2" in r.stderr and "Nothing was started" in r.stderr
    assert not (tmp_path / "ws").exists()


def test_missing_resume_source_is_refused(tmp_path: Path, cli) -> None:
    for source, problem in ((tmp_path / "nope", "no such run directory or checkpoint"),
                            (tmp_path, "holds no complete checkpoint")):
        r = cli([*SMOKE_CKPT2, f"resume={source}"], tmp_path / "out")
        assert r.returncode == 2, r.stdout + r.stderr
        assert problem in r.stderr and "Nothing was started" in r.stderr
        assert not (tmp_path / "out").exists()
