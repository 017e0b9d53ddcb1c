"""Which devices a concurrent sweep's jobs run on: disjoint sets of the visible GPUs, or of the CPU cores.

A job of world size W gets W GPUs (a CPU job W × ``sweep.cores_per_rank`` cores), never shared with a job that
runs at the same time. Among the free GPUs a set whose every pair reaches each other directly (peer-to-peer:
NVLink or PCIe P2P) is preferred; a set without is still used, and said so (its gradients then go through host
memory). Pure, except :func:`gpu_peers`, which asks ``nvidia-smi`` (the driver never imports torch).
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

# Past this many free devices, sets are not enumerated exhaustively (C(16, 8) = 12870 is still cheap).
_EXHAUSTIVE_UP_TO = 16


def parse_p2p(text: str) -> dict[int, set[int]]:
    """``nvidia-smi topo -p2p r``'s matrix → for each GPU index, the GPUs it reads from peer to peer (``OK``)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a terminal
    rows = [line.split() for line in text.splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0].startswith("GPU0")), None)
    if header is None:
        return {}
    names = [int(h[3:]) for h in header if h.startswith("GPU") and h[3:].isdigit()]
    peers: dict[int, set[int]] = {}
    for row in rows:
        if row is header or not row[0].startswith("GPU") or not row[0][3:].isdigit():
            continue
        me = int(row[0][3:])
        peers[me] = {names[i] for i, cell in enumerate(row[1:len(names) + 1]) if cell == "OK" and names[i] != me}
    return peers


def gpu_peers() -> dict[int, set[int]] | None:
    """Which physical GPUs reach each other peer to peer (``nvidia-smi topo -p2p r``); None when unknown."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "topo", "-p2p", "r"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_p2p(out.stdout) or None


def connected(ids: Sequence[int], peers: dict[int, set[int]] | None) -> bool | None:
    """Does every pair of ``ids`` reach each other peer to peer? None when unknown (no topology)."""
    if len(ids) < 2:
        return True
    if peers is None:
        return None
    return all(b in peers.get(a, set()) for a, b in itertools.combinations(ids, 2))


def choose(free: Sequence[int], need: int, ok: Callable[[Sequence[int]], bool | None] | None = None) -> list[int]:
    """``need`` ids out of ``free`` (in order): the first set ``ok`` accepts, else the first ``need``.
    ``need`` larger than ``free``: every free id (the job's plan then says what is missing)."""
    if need >= len(free):
        return list(free)
    if ok is not None and need > 1 and len(free) <= _EXHAUSTIVE_UP_TO:
        for ids in itertools.combinations(free, need):
            if ok(ids):
                return list(ids)
    return list(free[:need])


@dataclass
class Slots:
    """The devices (GPU indices or core ids) a sweep packs its jobs onto; each taken set is given back."""

    kind: str  # "gpu" or "cpu"
    ids: list[int]
    peers: dict[int, set[int]] | None = None
    busy: set[int] = field(default_factory=set)

    @property
    def free(self) -> list[int]:
        """The ids no running job holds, in order."""
        return [i for i in self.ids if i not in self.busy]

    def fits(self, need: int) -> bool:
        """Can a job needing ``need`` devices start now? One needing more than there are waits for all of them."""
        return len(self.free) >= min(need, len(self.ids))

    def take(self, need: int) -> tuple[list[int], bool | None]:
        """A set of ``need`` free ids (peer-connected where possible), and whether it is peer-connected."""
        ok = (lambda ids: connected(ids, self.peers)) if self.kind == "gpu" else None
        ids = choose(self.free, need, ok)
        self.busy.update(ids)
        return ids, connected(ids, self.peers) if self.kind == "gpu" else None

    def give(self, ids: Iterable[int]) -> None:
        """A job ended: its devices are free again."""
        self.busy.difference_update(ids)


def limit(parallel: object) -> int | None:
    """How many jobs may run at once by ``sweep.parallel``: ``auto`` as many as the devices hold (None), a number
    at most that many, ``false`` one (the jobs run one after another, in this process)."""
    if parallel is True or parallel in ("auto", "true"):
        return None
    if parallel is None or parallel is False or parallel == "false":
        return 1
    return max(1, int(parallel))  # type: ignore[call-overload]
