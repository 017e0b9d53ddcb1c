"""The README leads a newcomer in five minutes: short, with the two make commands, completion and the docs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_is_short_and_holds_the_main_path() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for must in ("make run", "make test", "pip install", "ddp-run -sc install=bash", "dry_run=true", "--help",
                 "resume=", "tensorboard --logdir", "docs/config.md"):
        assert must in text, must


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert on_disk - linked == set(), "a docs page the README does not link"


def test_the_pip_path_says_first_how_to_get_the_cpu_build_of_torch() -> None:
    """PyPI's torch on Linux is the CUDA build: the pip path's first lines install the CPU build first, from the
    index ddp-doctor names, and say how to see which build is installed."""
    from ddp_runner.diagnostics.doctor import CPU_INDEX

    text = (ROOT / "README.md").read_text()
    intro, rest = text[text.index("With pip"):].split("```bash\n", 1)
    commands = rest.split("\n```", 1)[0].splitlines()
    assert "CUDA build" in intro and "CPU build" in intro
    assert commands[0].startswith("pip install torch==") and f"--index-url {CPU_INDEX}" in commands[0], commands
    assert any(c.startswith("pip install .") for c in commands[1:])
    assert any(c.startswith("ddp-doctor") for c in commands)
