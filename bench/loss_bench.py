"""LM head + cross-entropy, forward and backward, at GPT-2 small's shape on one GPU: plain vs fused.

``plain`` is the unfused path of ``tasks.gpt_model`` (logits, then ``lm_loss``); ``fused`` is
``tasks.fused_ce.linear_cross_entropy``, at its default Triton launch shape and at each ``--kernels``
BLOCKxWARPS. Each is compiled, run under bf16 autocast from float32 hidden states and weights as in the model,
checked against float32 ``F.cross_entropy`` on the same bf16 logits, and timed with CUDA events (median of
--iters after warm-up).

Usage: python bench/loss_bench.py [--rows 16384] [--kernels 4096x16,8192x32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_runner.tasks.gpt import fused_ce  # noqa: E402
from ddp_runner.tasks.gpt.fused_ce import linear_cross_entropy  # noqa: E402
from ddp_runner.tasks.gpt.model import lm_loss  # noqa: E402


def time_fwd_bwd(fn, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, iters: int) -> tuple[float, list]:
    """Median ms of forward + backward, and the (loss, d hidden, d weight) of the last call."""
    times = []
    for i in range(iters + 3):
        h.grad = w.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(h, w, t)
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return statistics.median(times), [loss.detach(), h.grad.clone(), w.grad.clone()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16 * 1024)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--kernels", default="", help="extra Triton launch shapes BLOCKxWARPS, e.g. 4096x16,8192x32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("loss_bench: no CUDA device visible; this benchmark needs a GPU (skipped)")
        return
    torch.manual_seed(0)
    dev = "cuda"
    h = torch.randn(a.rows, a.width, device=dev, requires_grad=True)
    w = (0.02 * torch.randn(a.vocab, a.width, device=dev)).requires_grad_()
    t = torch.randint(0, a.vocab, (a.rows,), device=dev)

    # Reference: float32 cross-entropy of the same bf16-rounded logits.
    hb, wb = h.detach().bfloat16().float().requires_grad_(), w.detach().bfloat16().float().requires_grad_()
    ref_loss = F.cross_entropy((hb @ wb.t()).bfloat16().float(), t)
    ref_gh, ref_gw = torch.autograd.grad(ref_loss, (hb, wb))

    default = (fused_ce.BLOCK, fused_ce.NUM_WARPS)
    fused = torch.compile(linear_cross_entropy)
    variants = [("plain", torch.compile(lambda h, w, t: lm_loss(F.linear(h, w), t)), default),
                ("fused", fused, default)]
    for shape in filter(None, a.kernels.split(",")):
        block, warps = map(int, shape.split("x"))
        variants.append((f"fused BLOCK={block} warps={warps}", fused, (block, warps)))
    rows = []
    for name, fn, (fused_ce.BLOCK, fused_ce.NUM_WARPS) in variants:
        ms, (loss, gh, gw) = time_fwd_bwd(fn, h, w, t, a.iters)
        row = {"variant": name, "ms": round(ms, 3), "loss": loss.item(),
               "loss_err": abs(loss.item() - ref_loss.item()),
               "dh_rel_err": ((gh - ref_gh).norm() / ref_gh.norm()).item(),
               "dw_rel_err": ((gw - ref_gw).norm() / ref_gw.norm()).item()}
        row["kernel"] = f"{fused_ce.BLOCK}x{fused_ce.NUM_WARPS}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| variant | fwd+bwd ms | loss error | d hidden rel. error | d weight rel. error |\n|---|---|---|---|---|")
    for r in rows:
        errs = " | ".join(f"{r[k]:.2e}" for k in ("loss_err", "dh_rel_err", "dw_rel_err"))
        print(f"| {r['variant']} | {r['ms']:.3f} | {errs} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "rows": a.rows, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
