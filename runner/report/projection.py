"""The scaling projection's arithmetic: from measured runs and links to step time, throughput, scaling efficiency
and cost at any number of ranks. Pure functions over numbers (reading run directories: projection_inputs.py; the
report: projection_report.py); the model and its limits are stated in docs/scaling.md.

One optimizer step on the slowest rank:

    T(N) = κ(N) · (s(N) · n(N) + o(N) + ρ · C(N))

- ``s(N)``: seconds of data and compute per sample on one rank that has its device to itself: ``s₁`` measured on
  one rank, which runs its model without a DDP wrapper, and ``s_d`` measured on the runs of 2 or more ranks for every
  N ≥ 2 (DDP's hooks, ranks sharing the host's memory and caches); ``n(N)`` samples per rank and step (global batch / N
  at a fixed global batch; the measured micro-batch × accumulation at a fixed per-rank batch), ``o(N)`` the
  optimizer's seconds per step (divided by N where the strategy shards it);
- ``κ(N)``: how many ranks share one device, ≥ 1 (CPU ranks sharing a host's cores, for their communication too:
  gloo reduces on the CPU; 1 on GPUs);
- ``C(N)``: the step's collectives, each ``α·⌈log₂N⌉ + β·bytes·f(N)`` per bucket (all-reduce f = 2(N−1)/N,
  reduce-scatter and all-gather (N−1)/N), only on the micro-steps that synchronise (accumulation's ``no_sync``
  steps send nothing under DDP);
- ``ρ``: the measured exposure, the exposed gradient sync the runs timed over the ``C`` the model gives for them
  (below 1: the backward hid part of it; above 1: the collective cost more in training than on the measured link).

``s₁``, ``s_d``, ``o`` and ``ρ`` come from the measured runs (the per-rank time breakdown splits each step into work and
exposed communication); ``α`` and ``β`` from a link measurement (ddp-doctor) or, without one, from the runs' own
exposed sync.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

MiB = 1 << 20
DDP_FIRST_BUCKET_BYTES = 1 * MiB  # DDP's first bucket is capped at 1 MiB (torch.distributed's default), the rest at
DEFAULT_BUCKET_MB = 25.0          # train.ddp_bucket_mb
# A run that does not record its gradient bytes (older runs) is priced as if it sent this many: the link fitted to its
# own exposed sync is then in the same units, so the projection holds, though that link's figures mean nothing.
NOMINAL_GRAD_BYTES = 1.0 * MiB
EFFICIENCY_GOAL = 0.9
CHECK_GOAL = 0.10  # the projection's error on measured runs it was not fitted to (issue 44)
FIXED_GLOBAL, FIXED_PER_RANK = "fixed global batch", "fixed per-rank batch"
MODES = (FIXED_GLOBAL, FIXED_PER_RANK)
SHARDED_OPTIMIZER = ("zero1", "fsdp")  # each rank steps 1/N of the parameters


# -- links and collectives -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """A link's cost model: ``latency_s`` (α) per hop of a collective, ``bus_gbps`` the bus bandwidth in GB/s
    (1e9 bytes/s; nccl-tests' and ddp-doctor's busbw, so that a ring all-reduce of b bytes on N ranks takes
    b·2(N−1)/N / busbw)."""

    latency_s: float
    bus_gbps: float
    source: str = ""


@dataclass(frozen=True)
class Links:
    """Within a node, between nodes (None: not given, the node's link is used and the projection says so), and
    how many ranks a node holds."""

    intra: Link
    inter: Link | None = None
    ranks_per_node: int = 8

    def for_world(self, n: int) -> Link:
        """The link that sets the pace of a collective over ``n`` ranks: a ring over several nodes is as fast as
        its slowest hop, the inter-node one (its latency and bandwidth, whichever is worse)."""
        if n <= self.ranks_per_node or self.inter is None:
            return self.intra
        return Link(max(self.intra.latency_s, self.inter.latency_s), min(self.intra.bus_gbps, self.inter.bus_gbps),
                    self.inter.source)


def hops(n: int) -> int:
    """Latency steps of a tree collective over ``n`` ranks: ⌈log₂ n⌉ (0 for one rank; 3 ranks take 2), in integers
    so that no rounding of a logarithm makes a power of two one hop more or a ragged size one less."""
    return (n - 1).bit_length() if n > 1 else 0


def bus_factor(kind: str, n: int) -> float:
    """Bytes each rank's link carries per byte of the buffer: all-reduce 2(n−1)/n; reduce-scatter and all-gather
    (n−1)/n."""
    if n <= 1:
        return 0.0
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def collective_s(kind: str, nbytes: float, n: int, link: Link, buckets: int = 1) -> float:
    """Seconds of one ``kind`` collective (``all_reduce``, ``reduce_scatter``, ``all_gather``) of ``nbytes`` over
    ``n`` ranks, sent in ``buckets`` pieces: each ``α·⌈log₂ n⌉ + β·bytes·f(n)``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return buckets * link.latency_s * hops(n) + nbytes * bus_factor(kind, n) / (link.bus_gbps * 1e9)


def ddp_buckets(grad_bytes: float, bucket_mb: float | None) -> int:
    """How many buckets DDP reduces ``grad_bytes`` in: the first up to 1 MiB, the others up to ``bucket_mb``."""
    cap = (bucket_mb or DEFAULT_BUCKET_MB) * MiB
    rest = max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / cap)


def fit_link(rows: Sequence[Mapping[str, float]], nranks: int, source: str = "") -> Link | None:
    """α and busbw from an all-reduce measurement (ddp-doctor's rows: ``bytes``, ``time_us``) over ``nranks``: the
    line time = a + b·bytes fitted to relative error (so that the small sizes, where latency shows, count as much as
    the large ones) gives α = a / ⌈log₂ n⌉ and busbw = 2(n−1)/n / b. None when the rows cannot give a positive
    bandwidth."""
    pts = [(float(r["bytes"]), float(r["time_us"]) * 1e-6) for r in rows if r.get("bytes") and r.get("time_us")]
    if nranks < 2 or not pts:
        return None
    if len({b for b, _ in pts}) < 2:  # one size: all of it bandwidth
        b, t = pts[0]
        return Link(0.0, b * bus_factor("all_reduce", nranks) / t / 1e9, source) if t > 0 else None
    # Weighted least squares, weights 1/t²: minimise Σ((a + b·x − t) / t)².
    wpts = [(1.0 / (t * t), x, t) for x, t in pts]
    sw, sx, st = sum(w for w, _, _ in wpts), sum(w * x for w, x, _ in wpts), sum(w * t for w, _, t in wpts)
    sxx, sxt = sum(w * x * x for w, x, _ in wpts), sum(w * x * t for w, x, t in wpts)
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det if det > 0 else 0.0
    if slope <= 0:
        return None
    intercept = max(0.0, (st - slope * sx) / sw)
    return Link(intercept / hops(nranks), bus_factor("all_reduce", nranks) / slope / 1e9, source)


# -- what was measured ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """One measured run, as numbers. The shares are the slowest rank's (its exposed sync is the communication
    nobody hid): ``work_share`` data + compute, ``optimizer_share``, ``sync_share`` exposed gradient sync, each a
    fraction of its step; ``step_s`` the run's median step time."""

    world: int
    global_batch: int
    micro_batch: int
    step_s: float
    work_share: float
    optimizer_share: float
    sync_share: float
    strategy: str = "ddp"
    grad_bytes: float | None = None     # bytes one gradient reduction moves (summary.json's scaling_facts)
    param_bytes: float | None = None    # bytes of the parameters a sharded strategy gathers
    bucket_mb: float | None = None      # train.ddp_bucket_mb
    tokens_per_sample: int | None = None
    steps: int = 0
    device: str = "cpu"
    cores: int | None = None            # CPU cores the ranks of a host share (device=cpu)
    threads_per_rank: int = 1
    ranks_per_node: int | None = None   # ranks on this run's host
    reshard_after_forward: bool = True  # fsdp
    spread: float | None = None         # ± half the range of its logging windows' step times over their median
    accumulate_unsharded: bool = True   # fsdp
    name: str = ""

    @property
    def samples_per_rank(self) -> float:
        """Samples each rank processes per optimizer step."""
        return self.global_batch / self.world


def contention(n_local: int, device: str, cores: int | None, threads: int = 1) -> float:
    """κ: how many ranks share one device. CPU ranks of one host share its cores: ``n_local`` ranks of ``threads``
    threads each on ``cores`` cores run max(1, n_local·threads/cores) times slower than alone; a GPU rank has its
    own device."""
    if device != "cpu" or not cores:
        return 1.0
    return max(1.0, n_local * max(1, threads) / cores)


def collectives(strategy: str, grad_bytes: float, param_bytes: float | None, accumulation: float,
                bucket_mb: float | None, reshard_after_forward: bool = True,
                accumulate_unsharded: bool = True) -> list[tuple[str, float, int, float]]:
    """The collectives of one optimizer step: ``(kind, bytes, buckets, times)``.

    ddp: one bucketed all-reduce of the gradients, on the last micro-step only (the others run under ``no_sync``).
    zero1: the same, and the updated parameters all-gathered after the sharded optimizer step. fsdp: gradients
    reduce-scattered and parameters all-gathered per block: with ``accumulate_unsharded`` once per step (one
    gather more per micro-step when blocks are resharded after their forward), else on every micro-step.
    """
    params = param_bytes if param_bytes is not None else grad_bytes
    if strategy == "fsdp":
        per = max(1, math.ceil(max(grad_bytes, params) / ((bucket_mb or DEFAULT_BUCKET_MB) * MiB)))
        if accumulate_unsharded:
            gathers, scatters = 1 + (accumulation if reshard_after_forward else 0), 1
        else:
            gathers, scatters = accumulation * (2 if reshard_after_forward else 1), accumulation
        return [("reduce_scatter", grad_bytes, per, scatters), ("all_gather", params, per, gathers)]
    out = [("all_reduce", grad_bytes, ddp_buckets(grad_bytes, bucket_mb), 1.0)]
    if strategy == "zero1":
        out.append(("all_gather", params, 1, 1.0))
    return out


def comm_s(plan: Sequence[tuple[str, float, int, float]], n: int, link: Link) -> float:
    """Seconds of a step's collectives (:func:`collectives`) over ``n`` ranks on ``link``."""
    return sum(times * collective_s(kind, nbytes, n, link, buckets) for kind, nbytes, buckets, times in plan)


# -- calibration ---------------------------------------------------------------------------------------------

class Unpriced(ValueError):
    """The runs of a fit cannot price communication: none of 2 or more ranks timed its gradient sync, and no link
    was measured (the report says which of the two the user can give)."""


@dataclass(frozen=True)
class Model:
    """The calibrated model (see the module's docstring). ``link``: the links the collectives are priced on;
    ``exposure``: ρ; ``base``: the run with the fewest ranks, whose global batch, micro-batch and facts the
    projection keeps; ``notes``: what the calibration had to assume."""

    sample_s: float          # s_d: at 2 or more ranks
    optimizer_s: float
    exposure: float
    links: Links
    base: Measured
    calibrated_on: tuple[int, ...]
    notes: tuple[str, ...] = ()
    single_sample_s: float | None = None  # s₁: one rank, no DDP wrapper (None: as s_d)


def _kappa(m: Measured, n: int, ranks_per_node: int | None = None) -> float:
    local = min(n, ranks_per_node or m.ranks_per_node or n)
    return contention(local, m.device, m.cores, m.threads_per_rank)


def _plan(m: Measured, n: int, samples_per_rank: float) -> list[tuple[str, float, int, float]]:
    accumulation = max(1.0, samples_per_rank / m.micro_batch)
    return collectives(m.strategy, m.grad_bytes or NOMINAL_GRAD_BYTES, m.param_bytes, accumulation, m.bucket_mb,
                       m.reshard_after_forward, m.accumulate_unsharded)


def _exposed(m: Measured) -> float:
    """A run's exposed gradient sync in seconds, as if its ranks had their devices to themselves."""
    return m.sync_share * m.step_s / _kappa(m, m.world)


def self_measured_link(runs: Sequence[Measured]) -> Link | None:
    """The link as the runs themselves saw it, without a link measurement: their exposed sync taken as all
    communication, α and β fitted to it (least squares, α ≥ 0) where two or more world sizes synchronised, else
    α = 0 and β from the one. None when no run synchronised."""
    pts = []
    for m in runs:
        if m.world < 2 or m.sync_share <= 0:
            continue
        plan = _plan(m, m.world, m.samples_per_rank)
        latency = sum(t * b * hops(m.world) for _, _, b, t in plan)  # seconds per second of α
        volume = sum(t * nb * bus_factor(k, m.world) for k, nb, _, t in plan)
        pts.append((latency, volume, _exposed(m)))
    if not pts:
        return None
    if len({(a, v) for a, v, _ in pts}) >= 2:
        # Minimise Σ(α·a + β·v − e)² with α, β ≥ 0 (normal equations; a boundary when one comes out negative).
        saa = sum(a * a for a, _, _ in pts)
        svv = sum(v * v for _, v, _ in pts)
        sav = sum(a * v for a, v, _ in pts)
        sae = sum(a * e for a, _, e in pts)
        sve = sum(v * e for _, v, e in pts)
        det = saa * svv - sav * sav
        if det > 0:
            alpha, beta = (sae * svv - sve * sav) / det, (saa * sve - sav * sae) / det
            if alpha >= 0 and beta > 0:
                return Link(alpha, 1.0 / beta / 1e9, "fitted to the runs' exposed sync")
    beta = sum(e for _, _, e in pts) / sum(v for _, v, _ in pts)
    return Link(0.0, 1.0 / beta / 1e9, "the runs' exposed sync") if beta > 0 else None


def calibrate(runs: Sequence[Measured], intra: Link | None = None, inter: Link | None = None,
              ranks_per_node: int = 8) -> Model:
    """Fit ``s``, ``o`` and ρ to ``runs`` (each contributes equally). ``intra``: the measured link within a node,
    or None to take it from the runs' own exposed sync (:func:`self_measured_link`); ``inter``: between nodes
    (None: the node's link, and the projection says so). Raises ValueError when the runs cannot calibrate a model
    (none, or communication to price and nothing measured it)."""
    if not runs:
        raise ValueError("no measured run to calibrate on")
    base = min(runs, key=lambda m: (m.world, m.name))
    notes: list[str] = []
    single, synced = [m for m in runs if m.world == 1], [m for m in runs if m.world > 1]
    per_sample = {m.name: m.work_share * m.step_s / (_kappa(m, m.world) * m.samples_per_rank) for m in runs}
    sample_s = statistics.fmean(per_sample[m.name] for m in synced or runs)
    single_s = statistics.fmean(per_sample[m.name] for m in single) if single else None
    if not synced:
        notes.append("no run of 2 or more ranks: their compute per sample is the 1-rank run's, which has no DDP "
                     "wrapper (optimistic)")
    optimizer_s = statistics.fmean(m.optimizer_share * m.step_s / _kappa(m, m.world)
                                   * (m.world if m.strategy in SHARDED_OPTIMIZER else 1) for m in runs)
    if intra is not None and not all(m.grad_bytes for m in runs):
        notes.append("the runs do not record their gradient bytes (summary.json scaling_facts): the measured link "
                     "is not used")
        intra = None
    if intra is None:
        intra = self_measured_link(runs)
        if intra is None:
            raise Unpriced("no run of the fit timed its gradient sync, and no link was measured: nothing says what "
                           "communication costs")
        exposure = 1.0
    elif synced:
        links = Links(intra, inter, ranks_per_node)
        exposure = statistics.fmean(_exposed(m) / comm_s(_plan(m, m.world, m.samples_per_rank), m.world,
                                                         links.for_world(m.world)) for m in synced)
    else:
        exposure = 1.0
        notes.append("no measured run synchronised gradients: none of the communication is assumed hidden "
                     "behind the backward (ρ = 1)")
    return Model(sample_s, optimizer_s, exposure, Links(intra, inter, ranks_per_node), base,
                 tuple(sorted({m.world for m in runs})), tuple(notes), single_s)


# -- projection ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """The projection at ``world`` ranks in one mode: step time and its parts (seconds), throughput (the base
    run's unit), scaling efficiency against the model at one rank, device-hours and cost of one run (the base
    run's samples: its steps × its global batch); ``feasible`` False where the global batch cannot be split."""

    world: int
    mode: str
    samples_per_rank: float
    step_s: float
    work_s: float
    comm_s: float
    rate: float
    efficiency: float
    device_hours: float | None
    cost: float | None
    beyond_node: bool
    feasible: bool = True


def step_parts(model: Model, n: int, samples_per_rank: float) -> tuple[float, float]:
    """(work, exposed communication) seconds of one step at ``n`` ranks with ``samples_per_rank`` samples each."""
    m = model.base
    opt = model.optimizer_s / (n if m.strategy in SHARDED_OPTIMIZER else 1)
    kappa = _kappa(m, n, model.links.ranks_per_node)
    per_sample = model.single_sample_s if n == 1 and model.single_sample_s is not None else model.sample_s
    work = kappa * (per_sample * samples_per_rank + opt)
    comm = kappa * model.exposure * comm_s(_plan(m, n, samples_per_rank), n, model.links.for_world(n)) if n > 1 else 0.0
    return work, comm


def samples_per_rank(model: Model, n: int, mode: str) -> float:
    """Samples per rank and step at ``n`` ranks: the base global batch split ``n`` ways, or the base run's own."""
    m = model.base
    return m.global_batch / n if mode == FIXED_GLOBAL else m.samples_per_rank


def project(model: Model, n: int, mode: str = FIXED_GLOBAL, price: float | None = None) -> Point:
    """The projection at ``n`` ranks in ``mode`` (:data:`MODES`). ``price``: per device-hour (None: no cost)."""
    m = model.base
    spr = samples_per_rank(model, n, mode)
    work, comm = step_parts(model, n, spr)
    step = work + comm
    rate = n * spr * (m.tokens_per_sample or 1) / step
    one_spr = samples_per_rank(model, 1, mode)
    one = sum(step_parts(model, 1, one_spr))
    # Strong scaling: one rank's time for the same batch over n ranks' time; weak: the same per-rank step time.
    eff = one / (n * step) if mode == FIXED_GLOBAL else one / step
    samples = m.steps * m.global_batch
    hours = samples / (n * spr) * step * n / 3600.0 if samples else None
    rpn = model.links.ranks_per_node
    return Point(n, mode, spr, step, work, comm, rate, eff, hours,
                 hours * price if hours is not None and price is not None else None,
                 beyond_node=n > rpn, feasible=spr >= 1.0)


def measured_modes(model: Model, m: Measured) -> tuple[str, ...]:
    """The modes whose batch a measured run ran at: the base run's global batch (fixed global), its samples per
    rank (fixed per-rank); a 1-rank base run is in both; a run at neither batch is in none."""
    base = model.base
    return tuple(mode for mode, same in ((FIXED_GLOBAL, m.global_batch == base.global_batch),
                                         (FIXED_PER_RANK, math.isclose(m.samples_per_rank, base.samples_per_rank)))
                 if same)


def measured_point(model: Model, m: Measured, mode: str, one_step_s: float | None,
                   price: float | None = None) -> Point:
    """A measured run as a row of the projected table in ``mode``: what it measured (step, its work and exposed sync,
    throughput), not what the model gives for it. Efficiency against ``one_step_s``, a measured 1-rank run's step at
    the batch ``mode`` keeps (NaN: none measured); hours and cost of the base run's samples, as :func:`project`."""
    base = model.base
    spr = m.samples_per_rank
    comm = m.sync_share * m.step_s
    rate = m.global_batch * (m.tokens_per_sample or 1) / m.step_s
    if one_step_s is None:
        eff = math.nan
    else:
        eff = one_step_s / (m.world * m.step_s) if mode == FIXED_GLOBAL else one_step_s / m.step_s
    samples = base.steps * base.global_batch
    hours = samples / (m.world * spr) * m.step_s * m.world / 3600.0 if samples else None
    return Point(m.world, mode, spr, m.step_s, m.step_s - comm, comm, rate, eff, hours,
                 hours * price if hours is not None and price is not None else None,
                 beyond_node=m.world > model.links.ranks_per_node)


def largest_efficient(model: Model, mode: str, upto: int, goal: float = EFFICIENCY_GOAL) -> int | None:
    """The largest N ≤ ``upto`` whose projected efficiency is ≥ ``goal``, every smaller N's too (efficiency falls
    with N here, so the first miss ends the search); None when even 2 ranks miss it."""
    best = None
    for n in range(1, upto + 1):
        p = project(model, n, mode)
        if not p.feasible or p.efficiency < goal:
            break
        best = n
    return best if best and best > 1 else None


def measured_at(model: Model, m: Measured) -> Point:
    """The projection of a measured run's own configuration (its world size, at its global batch)."""
    return project(replace(model, base=replace(model.base, global_batch=m.global_batch)), m.world, FIXED_GLOBAL)


def errors(model: Model, runs: Iterable[Measured]) -> list[tuple[Measured, Point, float]]:
    """For each run: the projection at its configuration and the relative error of the projected throughput
    ((projected − measured) / measured; the step time's error has the other sign)."""
    out = []
    for m in runs:
        p = measured_at(model, m)
        measured_rate = m.world * m.samples_per_rank * (m.tokens_per_sample or 1) / m.step_s
        out.append((m, p, p.rate / measured_rate - 1.0))
    return out


def held_out_split(worlds: Iterable[int], priced: bool = False) -> tuple[list[int], list[int]]:
    """The default calibration and check: the smallest ⌈k/2⌉ of k measured world sizes calibrate, the others are
    projected and compared (1, 2 | 3, 4; 1, 2 | 3; one world size calibrates on itself). A fit of 1-rank
    runs alone prices no communication unless a link was measured (``priced``): then all of them are fitted and
    nothing is left to check (1, 2 | none: the error needs a third world size; with a link, 1 | 2)."""
    ws = sorted(set(worlds))
    k = math.ceil(len(ws) / 2)
    cal, check = ws[:k], ws[k:]
    if check and cal[-1] < 2 and not priced:
        return ws, []
    return cal, check
