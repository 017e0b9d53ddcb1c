"""The memory planner: per-rank memory of a plan under each strategy, checked against the device before launch.

Per rank, in bytes, with ``N`` trained parameters, ``W`` ranks, fp32 master weights, AdamW (two fp32 moments):

| | ddp | zero1 | fsdp |
| --- | --- | --- | --- |
| parameters | 4N | 4N | 4N/W |
| gradients | 4N | 4N | 4N/W |
| optimizer state | 8N | 8N/W | 8N/W |
| transient | 2N (autocast's 16-bit weight copies) + 4N when W > 1 (measured) | same | gathered units, see below |

FSDP drops the gradients after every optimizer step, and the backward makes them while it frees the activations:
its peak holds the larger of the two (``grads_gb`` is the part of the gradients above the activations), except
when sharded gradients are accumulated over micro-steps (one rank, or ``accumulate_unsharded=false``): then both.
DDP's and ZeRO-1's gradients live in DDP's buckets for the whole run.

FSDP's transient: the gathered units (two blocks in flight, and the root) in the compute dtype, and their fp32
gradients before the reduce-scatter; with accumulation and ``accumulate_unsharded``, the whole unsharded model
and its fp32 gradients.

Activations (every strategy): saved tensors per token per transformer layer, Korthikanti et al. 2022 (Megatron,
"Reducing activation recomputation"): ``34·d`` bytes in 16-bit precision, of which ``2·d`` are dropout masks (none
without dropout), twice that in fp32, plus ``5·heads·T`` bytes per token for the attention scores when no fused
(flash) attention kernel runs (CPU), plus what the loss keeps: the fused loss the logits, which become their own
gradient (``vocab`` values per token in the compute dtype); the plain loss bf16 logits and their fp32 softmax.
Checked against the allocator's own record at the peak on H200 (``bench/memory_peak.py``, BENCHMARKS.md).
CUDA adds a fixed workspace (cuBLAS, the allocator's rounding). The model's counts come from
``tasks/engine/driver_probe.py``, run in a subprocess (the driver never imports torch; runner/config/probe.py).

Checked against ``strategy.memory_cap_gb``, else ``$DDP_RUNNER_MEMORY_CAP_GB``, else the GPU's total memory;
on CPU without a cap nothing is estimated (nothing to protect, and the probe would cost every run a torch import).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any

from ddp_runner.config.plan import Plan, auto_record
from ddp_runner.config.probe import Probe, ProbeError
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import asked_cap_gb

GIB = 2**30
STRATEGIES = ("ddp", "zero1", "fsdp")
CUDA_WORKSPACE_GB = 0.5  # cuBLAS workspaces and the caching allocator's block rounding (not per-token)
ACT_16BIT = 34           # bytes per token per layer per unit of width, 16-bit activations (Megatron)
DROPOUT_MASKS = 2        # of those, the two dropout masks (attention output, MLP output)
# The share of the cap a suggested plan may be estimated at: the estimates fall within 15% of the measured peaks,
# and a cap is held on the GPU (the allocator's reserved bytes, fragmentation included), so a fix packed up to
# the cap can run out of memory.
HEADROOM = 0.85


@dataclass(frozen=True)
class ModelFacts:
    """What the probe measured: parameter counts and, for a GPT-like model, its shape."""

    params: int                      # unique trained parameters
    largest_unit: int                # parameters of the largest FSDP shard unit (one block)
    root: int                        # parameters outside every unit (embeddings, final norm)
    arch: dict[str, Any] | None = None


def activation_bytes_per_sample(arch: dict[str, Any] | None, precision: str, flash: bool) -> float | None:
    """Bytes of activations one sample keeps for the backward (None: not a model the formula knows)."""
    if not arch or not all(k in arch for k in ("layers", "width", "context", "vocab")):
        return None
    d, t, layers, v = arch["width"], arch["context"], arch["layers"], arch["vocab"]
    half = precision in ("bf16", "fp16")
    per_unit = ACT_16BIT - (0 if arch.get("dropout") else DROPOUT_MASKS)
    per_unit *= 1 if half else 2
    per_token = layers * per_unit * d
    if not flash:  # scores and softmax kept per head: 5·a·T bytes per token at 16-bit
        per_token += layers * 5 * arch.get("heads", 1) * t * (1 if half else 2)
    per_token += 3 * 4 * d  # embedding sum, final norm input and output (fp32)
    if arch.get("loss", "fused") == "fused":
        per_token += v * (2 if half else 4)  # the logits, overwritten by their gradient, kept for the backward
    else:
        per_token += v * (2 + 4)  # logits in 16-bit and the fp32 copy the loss keeps
    return per_token * t


def optimizer_bytes_per_param(optimizer: str, momentum: float = 0.0) -> int:
    """fp32 state per parameter: AdamW's two moments, SGD's momentum buffer (none without momentum)."""
    if optimizer == "adamw":
        return 8
    return 4 if momentum else 0


def estimate(facts: ModelFacts, strategy: str, *, world_size: int, per_rank: int, accumulation: int,
             precision: str, optimizer: str = "adamw", momentum: float = 0.0, cuda: bool = True,
             reshard_after_forward: bool = True, accumulate_unsharded: bool = True) -> dict[str, float]:
    """Per-rank memory of one strategy in GiB: parameters, gradients, optimizer, activations, transient, total."""
    n, w = facts.params, world_size
    half = precision in ("bf16", "fp16")
    compute = 2 if half else 4  # bytes of a parameter as the matmuls see it
    opt = optimizer_bytes_per_param(optimizer, momentum) * n
    if strategy == "fsdp":
        params, grads, opt_state = 4 * n / w, 4 * n / w, opt / w
        if w == 1:
            transient = 0.0  # nothing to gather: FSDP2 keeps the only shard, which is the whole parameter
        else:
            gathered = facts.root + (2 * facts.largest_unit if reshard_after_forward else n - facts.root)
            transient = compute * gathered + 4 * 2 * facts.largest_unit  # + unsharded fp32 grads in flight
            if accumulation > 1 and accumulate_unsharded:
                transient = max(transient, (compute + 4) * n)
    elif strategy in ("ddp", "zero1"):
        params, grads = 4 * n, 4 * n
        opt_state = opt if strategy == "ddp" or w == 1 else opt / w
        transient = 2 * n if half else 0.0  # autocast caches a 16-bit copy of every weight for the step
        if w > 1:  # measured: DDP on 2×H200 peaks one fp32 gradient copy above 1 GPU (8.37 vs 7.90 GB, GPT-2 small)
            transient += 4 * n
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    act_per_sample = activation_bytes_per_sample(facts.arch, precision, flash=cuda)
    acts = per_rank * (act_per_sample or 0.0)
    workspace = CUDA_WORKSPACE_GB * GIB if cuda else 0.0
    # FSDP's gradients are made as the activations are freed: only what exceeds them adds to the peak. Unless
    # they are accumulated sharded (or on one rank): then the earlier micro-steps' gradients live through the
    # next forward.
    if strategy == "fsdp" and not (accumulation > 1 and (w == 1 or not accumulate_unsharded)):
        grads = max(0.0, grads - acts)
    parts = {"params_gb": params, "grads_gb": grads, "optimizer_gb": opt_state, "activations_gb": acts,
             "transient_gb": transient + workspace}
    out = {k: v / GIB for k, v in parts.items()}
    out["total_gb"] = sum(out.values())
    return out


def plan_all(facts: ModelFacts, cfg: dict[str, Any], plan: Plan) -> dict[str, dict[str, float]]:
    """:func:`estimate` for every strategy at this plan's world size, per-rank batch and precision."""
    train, scfg = cfg.get("train", {}), cfg.get("strategy") or {}
    return {s: estimate(facts, s, world_size=plan.world_size, per_rank=plan.per_rank_batch,
                        accumulation=plan.accumulation, precision=train.get("precision", "fp32"),
                        optimizer=train.get("optimizer", "adamw"), momentum=train.get("momentum") or 0.0,
                        cuda=plan.device == "cuda",
                        reshard_after_forward=bool(scfg.get("reshard_after_forward", True)),
                        accumulate_unsharded=bool(scfg.get("accumulate_unsharded", True)))
            for s in STRATEGIES}


def cap_gb(cfg: dict[str, Any], device_gb: float | None) -> tuple[float | None, str]:
    """The per-rank memory to plan against, and where that number came from."""
    asked, source = asked_cap_gb(cfg)
    if asked is not None:
        return asked, source
    if device_gb is not None:
        return device_gb, "the GPU's total memory"
    return None, "no limit (CPU)"


def decide(estimates: dict[str, dict[str, float]], chosen: str, cap: float | None, source: str,
           plan: Plan) -> None:
    """Refuse (PlanError) when ``chosen`` needs more than ``cap``; the fix names a strategy that fits, or the
    per-rank batch at which the leanest one would."""
    if cap is None or estimates[chosen]["total_gb"] <= cap:
        return
    need = estimates[chosen]
    problem = (f"needs ~{need['total_gb']:.3g} GiB per rank ({_parts(need)}), over the {cap:.3g} GiB of {source}")
    target = cap * HEADROOM
    fitting = [s for s in STRATEGIES if s != chosen and estimates[s]["total_gb"] <= target]
    if fitting:
        s = fitting[0]
        fix = f"use strategy={s} (~{estimates[s]['total_gb']:.3g} GiB per rank)"
    else:
        lean = min(STRATEGIES, key=lambda s: estimates[s]["total_gb"])
        e = estimates[lean]
        per_sample = e["activations_gb"] / max(plan.per_rank_batch, 1)
        room = target - (e["total_gb"] - e["activations_gb"])
        fits = int(room // per_sample) if per_sample > 0 and room > 0 else 0
        # The largest per-rank batch that fits and still divides the global batch, so the suggestion is a valid plan.
        per_rank_total = plan.global_batch // plan.world_size
        fits = max((b for b in range(1, min(fits, per_rank_total) + 1) if per_rank_total % b == 0), default=0)
        if fits >= 1:
            # Accumulation under fsdp must not hold the unsharded model, or the smaller batch would not fit.
            lean_arg = f"strategy={lean}" + (" strategy.accumulate_unsharded=false" if lean == "fsdp" else "")
            fix = (f"use {lean_arg} with batch.per_rank={fits} (add batch.global={plan.global_batch} to keep"
                   " the global batch through accumulation)")
        else:
            fix = (f"no strategy fits on {plan.world_size} rank(s) with {1 - HEADROOM:.0%} to spare: even {lean}'s"
                   f" model state takes ~{e['total_gb'] - e['activations_gb']:.3g} GiB; use more GPUs with"
                   " strategy=fsdp, or a smaller model")
    raise PlanError("strategy", chosen, problem, fix)


def _parts(e: dict[str, float]) -> str:
    names = (("params_gb", "parameters"), ("grads_gb", "gradients"), ("optimizer_gb", "optimizer"),
             ("activations_gb", "activations"), ("transient_gb", "transient"))
    return ", ".join(f"{label} {e[k]:.3g}" for k, label in names)


def describe(memory: dict[str, Any]) -> str:
    """One line for the plan printout."""
    chosen = memory["strategy"]
    e = memory["estimates"][chosen]
    others = ", ".join(f"{s} {v['total_gb']:.3g}" for s, v in memory["estimates"].items() if s != chosen)
    cap = f" of {memory['cap_gb']:.3g} GiB" if memory["cap_gb"] is not None else ""
    return f"memory per rank ({chosen}): ~{e['total_gb']:.3g} GiB{cap} ({_parts(e)}); {others} GiB"


def tight(memory: dict[str, Any]) -> str | None:
    """A warning when an accepted plan's estimate is within the planner's error of the cap (None: room to spare)."""
    total, cap = memory["estimates"][memory["strategy"]]["total_gb"], memory["cap_gb"]
    if cap is None or total <= cap * HEADROOM:
        return None
    return (f"the memory estimate (~{total:.3g} GiB per rank) is over {HEADROOM:.0%} of the {cap:.3g} GiB cap, inside"
            " the planner's error: the run may run out of memory (a smaller batch.per_rank, with batch.global kept,"
            " leaves room)")


def larger_fsdp_micro_batch(facts: ModelFacts, cfg: dict[str, Any], plan: Plan,
                            cap: float | None) -> tuple[int, float] | None:
    """Under fsdp with accumulation: the largest per-rank batch that divides the global batch and fits ``cap`` with
    the planner's headroom, when it is larger than the plan's, and its estimate in GiB (None otherwise). FSDP runs
    its per-block hooks and copies on the host in every micro-step, so small micro-steps leave the GPU waiting on
    the host; fewer, larger ones hide that cost (BENCHMARKS.md, issue 33's fsdp profile)."""
    if cap is None or plan.accumulation <= 1 or plan.device != "cuda":
        return None
    train, scfg = cfg.get("train", {}), cfg.get("strategy") or {}
    per_rank_total = plan.global_batch // plan.world_size
    best = None
    for b in range(plan.per_rank_batch + 1, per_rank_total + 1):
        if per_rank_total % b:
            continue
        e = estimate(facts, "fsdp", world_size=plan.world_size, per_rank=b, accumulation=per_rank_total // b,
                     precision=train.get("precision", "fp32"), optimizer=train.get("optimizer", "adamw"),
                     momentum=train.get("momentum") or 0.0, cuda=True,
                     reshard_after_forward=bool(scfg.get("reshard_after_forward", True)),
                     accumulate_unsharded=bool(scfg.get("accumulate_unsharded", True)))
        if e["total_gb"] <= cap * HEADROOM:
            best = (b, e["total_gb"])
    return best


def auto_start(facts: ModelFacts, cfg: dict[str, Any], plan: Plan, strategy: str, cap: float | None,
               source: str) -> Plan:
    """``batch.per_rank=auto``: the plan at the largest micro-batch that divides the per-rank share and whose
    estimate fits ``cap`` with the planner's headroom (the smallest, 1, when none does: :func:`decide` then
    refuses it if even that does not fit). The ranks start there and halve on an out-of-memory error."""
    share = plan.global_batch // plan.world_size
    if cap is None:
        return plan
    train, scfg = cfg.get("train", {}), cfg.get("strategy") or {}
    for b in sorted((b for b in range(1, share + 1) if share % b == 0), reverse=True):
        e = estimate(facts, strategy, world_size=plan.world_size, per_rank=b, accumulation=share // b,
                     precision=train.get("precision", "fp32"), optimizer=train.get("optimizer", "adamw"),
                     momentum=train.get("momentum") or 0.0, cuda=plan.device == "cuda",
                     reshard_after_forward=bool(scfg.get("reshard_after_forward", True)),
                     accumulate_unsharded=bool(scfg.get("accumulate_unsharded", True)))
        if e["total_gb"] <= cap * HEADROOM or b == 1:
            why = (f"the largest divisor of the per-rank share {share} whose memory estimate (~{e['total_gb']:.3g}"
                   f" GiB) fits {HEADROOM:.0%} of the {cap:.3g} GiB of {source}")
            if e["total_gb"] > cap * HEADROOM:
                why = f"no micro-batch's estimate fits {HEADROOM:.0%} of the {cap:.3g} GiB of {source}; the smallest"
            return replace(plan, per_rank_batch=b, accumulation=share // b, micro_batch=auto_record(share, b, why))
    return plan


def with_start(plan: Plan, memory: dict[str, Any] | None) -> Plan:
    """The plan at the micro-batch :func:`check` chose for ``batch.per_rank=auto`` (``plan`` itself otherwise):
    what run.json records and the ranks start from."""
    chosen = (memory or {}).get("auto_micro_batch")
    if plan.micro_batch is None or not chosen:
        return plan
    return replace(plan, per_rank_batch=chosen["start"], accumulation=chosen["per_rank_share"] // chosen["start"],
                   micro_batch=chosen)


def fsdp_micro_batch_hint(memory: dict[str, Any], plan: Plan) -> str | None:
    """A warning for an fsdp plan whose micro-steps could be fewer and larger within the memory plan (None: no)."""
    b = memory.get("fsdp_micro_batch")
    if memory["strategy"] != "fsdp" or not b:
        return None
    acc = plan.global_batch // plan.world_size // b
    return (f"strategy=fsdp runs its per-block hooks on the host in each of the {plan.accumulation} micro-steps of"
            f" {plan.per_rank_batch}, which leaves the GPU waiting; batch.per_rank={b} (accumulation {acc}, the same"
            f" global batch {plan.global_batch}) fits the memory plan at ~{memory['fsdp_micro_batch_gb']:.3g} GiB of"
            f" {memory['cap_gb']:.3g}: fewer, larger micro-steps run faster")


def wanted(cfg: dict[str, Any]) -> bool:
    """Whether this config's plan will be checked (and so the probe's model facts are needed): on GPUs, or under
    an explicit cap. Decided before the devices are listed, so that the probe can start first."""
    if asked_cap_gb(cfg)[0] is not None:
        return True
    device = cfg.get("device")
    return device == "cuda" or (device != "cpu" and shutil.which("nvidia-smi") is not None)


def gpu_total_gb(plan: Plan) -> float | None:
    """Total memory of the first GPU the plan uses, from nvidia-smi (None when it cannot say)."""
    if plan.device != "cuda" or not plan.gpus or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                              "-i", str(plan.gpus[0].physical_index)], capture_output=True, text=True, timeout=30,
                             check=True).stdout
        return float(out.strip().splitlines()[0]) / 1024  # MiB → GiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def check(cfg: dict[str, Any], plan: Plan, probe: Probe | None) -> dict[str, Any] | None:
    """Estimate, and refuse a plan that does not fit (PlanError); the record for run.json, or None when there
    is nothing to check (CPU without a cap). ``probe``: the driver's probe, asked for the model's facts."""
    scfg = cfg.get("strategy") or {}
    explicit_cap = asked_cap_gb(cfg)[0] is not None
    if plan.device != "cuda" and not explicit_cap:
        return None
    try:
        if probe is None or "model" not in probe.want:
            raise ProbeError("the model was not probed")
        found = probe.result()["model"]
    except (ProbeError, OSError, ValueError, KeyError) as exc:
        if explicit_cap:
            raise PlanError("strategy.memory_cap_gb", scfg.get("memory_cap_gb"), str(exc),
                            "fix the task so its model builds on the meta device, or drop the cap") from exc
        print(f"ddp-run: warning: memory not estimated ({exc})", file=sys.stderr, flush=True)
        return None
    facts = ModelFacts(found["params"], found["largest_unit"], found["root"], found.get("arch"))
    cap, source = cap_gb(cfg, gpu_total_gb(plan))
    chosen = scfg.get("name", "ddp")
    if plan.micro_batch is not None:  # batch.per_rank=auto: start from the largest candidate the estimate fits
        plan = auto_start(facts, cfg, plan, chosen, cap, source)
    estimates = plan_all(facts, cfg, plan)
    record = {"strategy": chosen, "params": facts.params, "cap_gb": cap, "cap_source": source,
              "estimates": estimates, "activations_estimated": facts.arch is not None}
    if plan.micro_batch is not None:
        record["auto_micro_batch"] = plan.micro_batch
    decide(estimates, chosen, cap, source, plan)
    if chosen == "fsdp" and (larger := larger_fsdp_micro_batch(facts, cfg, plan, cap)) is not None:
        record.update(fsdp_micro_batch=larger[0], fsdp_micro_batch_gb=larger[1])
    return record
