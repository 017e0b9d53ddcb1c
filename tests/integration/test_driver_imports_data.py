"""Pre-launch data checks: unusable token files refused by key, ids beyond the model's vocabulary found (meta.json
or a scan), and describe() for run.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_driver_imports_stay_light() -> None:
    code = ("import sys, ddp_runner.data.prep, ddp_runner.contract.corpus, ddp_runner.data.tokenize; "
            "print(sorted(m for m in ('torch', 'numpy', 'tokenizers') if m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
