"""The default corpus: built from the stdlib once, cached, deterministic, atomic; driver-light imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_import_is_driver_light() -> None:
    code = "import sys, ddp_runner.contract.corpus; print(any(m in sys.modules for m in ('torch', 'numpy')))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
