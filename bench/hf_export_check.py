"""GPT-2 small's export loads in transformers with our logits, on a GPU (the CPU tests do it for a tiny GPT).

Trains the GPT-2 small preset for a few steps (or takes ``--run RUN_DIR``), exports its final checkpoint with
``ddp-export --format hf``, loads our GPT from ``model.safetensors`` and ``GPT2LMHeadModel.from_pretrained`` from
the hf folder, both in fp32 on one GPU with TF32 off, and compares their logits on a batch of random token ids:
prints the largest difference and PASS when ``torch.testing.assert_close(atol=1e-4, rtol=1e-4)`` holds.

Usage (GPU host; needs pip install -e '.[hf]'):
    python bench/hf_export_check.py                  # trains 20 steps of task=gpt2_small first
    python bench/hf_export_check.py --run <run dir>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--atol", type=float, default=1e-4)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hf-export-"))
    run = args.run
    if run is None:
        cmd = [sys.executable, "-m", "ddp_runner", "task=gpt2_small", f"train.max_steps={args.steps}",
               "train.val_every=0", "world_size=1", f"output.root={tmp / 'outputs'}"]
        subprocess.run(cmd, check=True)
        run = str(max((tmp / "outputs").rglob("summary.json")).parent)
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    from ddp_runner.tasks import export as cli
    from ddp_runner.tasks.gpt.model import GPT

    cli.main([run, "--out", str(tmp / "st")])
    cli.main([run, "--format", "hf", "--out", str(tmp / "hf")])
    m = json.loads((tmp / "st" / "export.json").read_text())["model"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ours = GPT(vocab=m["vocab"], context=m["context"], width=m["width"], layers=m["layers"], heads=m["heads"])
    ours.load_state_dict(load_file(tmp / "st" / "model.safetensors"))
    ours = ours.to(dev).eval()
    theirs = GPT2LMHeadModel.from_pretrained(tmp / "hf").to(dev).eval()
    x = torch.randint(0, min(m["vocab"], 50257), (args.batch, m["context"]), device=dev,
                      generator=torch.Generator(dev).manual_seed(0))
    with torch.no_grad():
        a, b = ours(x).float(), theirs(x).logits.float()
    diff = (a - b).abs().max().item()
    print(json.dumps({"run": run, "device": str(dev), "model": m, "max_abs_diff": diff,
                      "max_abs_logit": a.abs().max().item(), "atol": args.atol}, indent=2))
    torch.testing.assert_close(b, a, atol=args.atol, rtol=args.atol)
    print(f"PASS: GPT-2 small export matches in transformers (max |diff| {diff:.2e} <= {args.atol})")


if __name__ == "__main__":
    main()
