"""Throughput with extra loggers against TensorBoard alone: ``logger=[tensorboard,mlflow,csv]`` must stay within 1%.

Runs the same training job (default: the GPT-2 small preset on every visible GPU) alternately with
``logger=[tensorboard]`` and ``logger=[tensorboard,mlflow,csv]``, ``--pairs`` times (A B A B …, so that drift of the
machine hits both arms alike), reads each run's median throughput from summary.json (``median.tokens_per_s``: every
logging window but the first), and prints each arm's median, the ratio and PASS/FAIL against ``--tolerance``.

MLflow logs to a real tracking server this script starts on loopback (SQLite store under the output root), or to
``--tracking-uri``. Needs ``pip install -e '.[mlflow]'``.

Usage (GPU host):
    python bench/loggers.py --pairs 3 --steps 300
    python bench/loggers.py --log-every 1            # the hardest case: a log_batch per optimizer step
    python bench/loggers.py --preset gpt --device cpu --steps 40 --pairs 1 --world-size 2   # a CPU dry run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ARMS = {"tensorboard": "logger=[tensorboard]", "tensorboard+mlflow+csv": "logger=[tensorboard,mlflow,csv]"}


def _server(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--default-artifact-root", str(root / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):  # noqa: S310 - loopback
                return proc, url
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the MLflow server did not start within 120 s")


def _run(args: argparse.Namespace, root: Path, arm: str, uri: str) -> float:
    out = root / arm.replace("+", "_")
    cmd = [sys.executable, "-m", "ddp_runner", f"task={args.preset}", f"train.max_steps={args.steps}",
           ARMS[arm], "checkpoint.final=false", "train.val_every=0", f"output.root={out}", *args.extra]
    if "mlflow" in arm:  # keys of the mlflow logger exist only where it is selected
        cmd += [f"logger.mlflow.tracking_uri={uri}", "logger.mlflow.experiment=bench-loggers"]
    if args.world_size:
        cmd.append(f"world_size={args.world_size}")
    if args.device:
        cmd.append(f"device={args.device}")
    if args.log_every:
        cmd.append(f"train.log_every={args.log_every}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{arm}: ddp-run failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    newest = max(out.rglob("summary.json"), key=os.path.getmtime)
    median = json.loads(newest.read_text())["median"]
    rate = median.get("tokens_per_s") or 1 / median["step_time_s"]  # a task without tokens: steps/s
    print(f"  {arm:<24} {rate:,.0f} tokens/s  ({newest.parent.name})", flush=True)
    return float(rate)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gpt2_small")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--world-size", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--log-every", type=int, default=None, help="default: the preset's train.log_every")
    p.add_argument("--tracking-uri", default=None, help="default: a server started here on loopback")
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument("--reverse", action="store_true", help="the extra-logger arm first in each pair (order bias)")
    p.add_argument("--root", default=None, help="output root (default: a temporary folder)")
    p.add_argument("extra", nargs="*", help="more ddp-run overrides, e.g. train.compile=false")
    args = p.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="bench-loggers-"))
    root.mkdir(parents=True, exist_ok=True)
    proc, uri = (None, args.tracking_uri) if args.tracking_uri else _server(root)
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    try:
        for i in range(args.pairs):
            print(f"pair {i + 1}/{args.pairs}", flush=True)
            for arm in (reversed(list(ARMS)) if args.reverse else ARMS):
                rates[arm].append(_run(args, root, arm, uri))
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
    base, more = (statistics.median(rates[a]) for a in ARMS)
    ratio = more / base
    verdict = "PASS" if ratio >= 1 - args.tolerance else "FAIL"
    print(json.dumps({"preset": args.preset, "steps": args.steps, "pairs": args.pairs, "log_every": args.log_every,
                      "tokens_per_s": rates, "median": {"tensorboard": base, "tensorboard+mlflow+csv": more},
                      "ratio": round(ratio, 4), "verdict": verdict}, indent=2))
    print(f"{verdict}: tensorboard+mlflow+csv at {100 * ratio:.2f}% of tensorboard alone"
          f" (tolerance {100 * args.tolerance:.0f}%)")


if __name__ == "__main__":
    main()
