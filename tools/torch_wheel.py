"""Download the torch wheel ``make`` installs and print its path: the CPU build on a host without a GPU.

pip's own index serves the CUDA build of torch on Linux (2 GB+ with its CUDA libraries), useless on a CPU host.
There PyTorch's CPU wheel index (``--cpu-index``, the Makefile's ``TORCH_CPU_INDEX``) is asked first, with a short
timeout and no retries, so that a host that cannot reach it falls back to pip's own configuration (its index,
find-links, constraints) within seconds. Where the CPU index is not reachable but pip's configuration holds a CPU
wheel (a local wheel folder), that one is found in the first attempt too: the configuration's other sources stay
on. On a GPU host the Makefile passes no CPU index and pip's configuration alone decides.

Usage: ``python tools/torch_wheel.py VERSION DEST [--cpu-index URL] [--timeout S]``; the wheel's path on stdout,
what was chosen and why on stderr. Stdlib only: it runs with ``.venv``'s interpreter before anything is installed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

# pip's own words for a wheel it saved or found already in the destination folder.
_SAVED = re.compile(r"^(?:Saved|File was already downloaded) (\S+\.whl)\s*$", re.M)


def download(version: str, dest: str, index: str | None, timeout: float) -> tuple[str | None, str]:
    """pip download of ``torch==version`` into ``dest``: from ``index`` first (None: pip's configuration only).
    Returns the wheel's path (None when pip found none) and pip's output."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", dest,
           f"torch=={version}"]
    if index:
        # The index replaces pip's own index for this attempt only; find-links and extra indexes stay on.
        cmd += ["--index-url", index, "--timeout", str(timeout), "--retries", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        return None, out
    found = _SAVED.findall(out)
    if found:
        return os.path.abspath(found[-1]), out
    # pip said neither (another wording): the newest wheel of this version in the folder.
    wheels = sorted(glob.glob(os.path.join(dest, f"torch-{version}*.whl")), key=os.path.getmtime)
    return (wheels[-1] if wheels else None), out


def build_of(wheel: str) -> str:
    """Which build a torch wheel is, from its local version label (``torch-2.13.0+cpu-…``)."""
    name = os.path.basename(wheel)
    if "+cpu" in name:
        return "the CPU build"
    if cuda := re.search(r"\+(cu\d+)", name):
        return f"the CUDA build ({cuda.group(1)})"
    return "pip's default build (on Linux x86_64: the CUDA build)"


def main(argv: list[str] | None = None) -> int:
    """Download, say which build, print the path; exit 1 when no source had the wheel."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("version")
    p.add_argument("dest")
    p.add_argument("--cpu-index", default="", help="PyTorch's CPU wheel index; empty: pip's configuration only")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds the CPU index may take to answer")
    a = p.parse_args(argv)
    os.makedirs(a.dest, exist_ok=True)
    wheel = None
    if a.cpu_index:
        wheel, out = download(a.version, a.dest, a.cpu_index, a.timeout)
        if wheel is None:
            last = (out.strip().splitlines() or ["no answer"])[-1]
            print(f"torch_wheel: the CPU index {a.cpu_index} gave no torch {a.version} ({last}); falling back to"
                  " pip's own configuration", file=sys.stderr)
    if wheel is None:
        wheel, out = download(a.version, a.dest, None, a.timeout)
        if wheel is None:
            sys.stderr.write(out)
            print(f"torch_wheel: no torch {a.version} wheel found", file=sys.stderr)
            return 1
    print(f"torch_wheel: {os.path.basename(wheel)}: {build_of(wheel)}", file=sys.stderr)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
