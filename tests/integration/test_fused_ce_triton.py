"""The fused LM head + cross-entropy op compiled by inductor under bf16 autocast gives the unfused eager path's value
and gradients, and its Triton kernel (run by Triton's interpreter on the CPU) computes what the PyTorch fallback does.
(The eager op: tests/unit/test_fused_ce.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F

from ddp_runner.tasks.gpt.fused_ce import linear_cross_entropy
from ddp_runner.tasks.gpt.model import lm_loss

ROOT = Path(__file__).resolve().parents[2]


TRITON_CHECK = textwrap.dedent("""
    import torch
    from ddp_runner.tasks.gpt import fused_ce
    kernel = fused_ce._triton_kernel()
    torch.manual_seed(0)
    # Rows shorter than one block, several blocks with a ragged tail, and GPT-2's padded vocabulary.
    for rows, vocab, dtype in ((4, 17, torch.bfloat16), (5, 300, torch.float32), (2, 50304, torch.bfloat16)):
        x = (3 * torch.randn(rows, vocab)).to(dtype)
        t = torch.randint(0, vocab, (rows,))
        got, got_loss = x.clone(), torch.empty(rows)
        want, want_loss = x.clone(), torch.empty(rows)
        kernel[(rows,)](got, t, got_loss, got.stride(0), vocab, BLOCK=128)
        fused_ce._ce_inplace_torch(want, t, want_loss)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
        # softmax - onehot in [-1, 1]: one bf16 rounding step apart at most
        tol = 1e-6 if dtype == torch.float32 else 4e-3
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)
        assert (got.float().sum(1).abs() < 0.05).all()  # each row of softmax - onehot sums to 0
    print("triton kernel ok")
""")


# `make test` installs Triton here, outside site-packages (the Makefile says why); a host whose Python has it (a GPU
# host's torch) uses that one.
TRITON_HOME = Path(sys.prefix) / "triton"


def test_triton_kernel_matches_the_fallback_in_the_interpreter() -> None:
    found = importlib.util.find_spec("triton") is not None or (TRITON_HOME / "triton").is_dir()
    assert found, f"Triton is not installed: `make test` installs it into {TRITON_HOME}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join((str(ROOT), str(TRITON_HOME)))}
    r = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=280)
    assert r.returncode == 0 and "triton kernel ok" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_compiled_under_bf16_autocast_matches_the_plain_path() -> None:
    torch.manual_seed(0)
    h0, w0 = torch.randn(64, 32), 0.1 * torch.randn(100, 32)
    t = torch.randint(0, 100, (64,))
    results = []
    # The plain path eagerly, as the reference; the fused op through inductor.
    for fn in (lambda h, w: lm_loss(F.linear(h, w), t), torch.compile(lambda h, w: linear_cross_entropy(h, w, t))):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(h, w)
        loss.backward()
        assert loss.dtype == torch.float32 and h.grad.dtype == w.grad.dtype == torch.float32
        results.append((loss.detach(), h.grad, w.grad))
    (l0, h0g, w0g), (l1, h1g, w1g) = results
    torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-4)  # same bf16 logits, float32 softmax
    torch.testing.assert_close(h1g, h0g, rtol=2e-2, atol=1e-4)  # bf16 gradients of the logits either way
    torch.testing.assert_close(w1g, w0g, rtol=2e-2, atol=1e-4)
