"""The scaling projection's arithmetic (runner/report/projection.py): collective costs, the link fitted to a doctor
measurement, and the calibration checked against runs made by a known model, so that a projection that ignores the
measured communication share, the cores the ranks share or the strategy's collectives misses by more than 10%."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ddp_runner.report import projection as P

MB = 1e6
LINK = P.Link(latency_s=50e-6, bus_gbps=2.0)
GRAD = 40 * MB


def _truth_step(n: int, spr: float, *, sample_s: float = 0.004, opt_s: float = 0.003, exposure: float = 0.8,
                link: P.Link = LINK, cores: int | None = None, strategy: str = "ddp", single_s: float | None = None,
                ) -> tuple[float, float, float]:
    """(step, work, exposed sync) of a run made by the model itself, with a DDP-bucketed all-reduce of GRAD;
    ``single_s``: one rank's compute per sample, where it differs (no DDP wrapper)."""
    kappa = P.contention(n, "cpu", cores) if cores else 1.0
    opt = opt_s / (n if strategy in P.SHARDED_OPTIMIZER else 1)
    plan = P.collectives(strategy, GRAD, GRAD, max(1.0, spr / 4), None)
    comm = kappa * exposure * P.comm_s(plan, n, link) if n > 1 else 0.0  # gloo reduces on the shared cores too
    work = kappa * (single_s if n == 1 and single_s else sample_s) * spr
    return work + kappa * opt + comm, work, comm


def _run(n: int, global_batch: int = 96, cores: int | None = None, strategy: str = "ddp", **truth: float
         ) -> P.Measured:
    """A measured run as the runner records it: step time and the slowest rank's shares."""
    spr = global_batch / n
    step, work, comm = _truth_step(n, spr, cores=cores, strategy=strategy, **truth)
    return P.Measured(world=n, global_batch=global_batch, micro_batch=4, step_s=step, work_share=work / step,
                      optimizer_share=(step - work - comm) / step, sync_share=comm / step, strategy=strategy,
                      grad_bytes=GRAD, param_bytes=GRAD, tokens_per_sample=64, steps=100,
                      device="cpu" if cores else "cuda", cores=cores, ranks_per_node=n, name=f"w{n}")


# -- collectives and links -----------------------------------------------------------------------------------

def test_ring_all_reduce_costs_latency_per_hop_and_bus_bytes():
    assert P.collective_s("all_reduce", GRAD, 1, LINK) == 0.0
    assert P.collective_s("all_reduce", GRAD, 2, LINK) == pytest.approx(50e-6 + GRAD / 2e9)
    assert P.collective_s("all_reduce", GRAD, 4, LINK, buckets=3) == pytest.approx(3 * 2 * 50e-6 + GRAD * 1.5 / 2e9)
    # reduce-scatter and all-gather each carry half an all-reduce's bytes
    assert P.collective_s("reduce_scatter", GRAD, 4, P.Link(0.0, 2.0)) == pytest.approx(GRAD * 0.75 / 2e9)
    assert P.hops(512) == 9 and P.bus_factor("all_reduce", 512) == pytest.approx(2 * 511 / 512)


def test_ddp_buckets_start_with_one_mebibyte():
    assert P.ddp_buckets(0.4 * MB, 25) == 1
    assert P.ddp_buckets(100 * P.MiB, 25) == 1 + math.ceil(99 / 25)
    assert P.ddp_buckets(497 * MB, 100) == 1 + math.ceil((497 * MB - P.MiB) / (100 * P.MiB))


def test_the_link_is_fitted_to_a_doctor_measurement():
    sizes = (1 << 20, 1 << 24, 1 << 26)
    rows = [{"bytes": b, "time_us": 1e6 * P.collective_s("all_reduce", b, 4, LINK)} for b in sizes]
    link = P.fit_link(rows, 4, "doctor")
    assert link is not None and link.latency_s == pytest.approx(50e-6) and link.bus_gbps == pytest.approx(2.0)
    assert P.fit_link(rows, 1) is None


def test_a_ring_over_nodes_runs_at_the_inter_node_link():
    links = P.Links(P.Link(5e-6, 300.0), P.Link(20e-6, 40.0), ranks_per_node=8)
    assert links.for_world(8).bus_gbps == 300.0
    assert links.for_world(16).bus_gbps == 40.0 and links.for_world(16).latency_s == 20e-6
    assert P.Links(P.Link(5e-6, 300.0), None, 8).for_world(64).bus_gbps == 300.0


def test_strategies_send_their_own_collectives():
    assert P.collectives("ddp", GRAD, GRAD, 4, 25) == [("all_reduce", GRAD, P.ddp_buckets(GRAD, 25), 1.0)]
    assert [c[0] for c in P.collectives("zero1", GRAD, GRAD, 4, 25)] == ["all_reduce", "all_gather"]
    fsdp = P.collectives("fsdp", GRAD, GRAD / 2, 4, 25)  # accumulate_unsharded, resharded after the forward
    assert [(k, t) for k, _, _, t in fsdp] == [("reduce_scatter", 1), ("all_gather", 5)]
    per_micro = P.collectives("fsdp", GRAD, GRAD / 2, 4, 25, reshard_after_forward=True, accumulate_unsharded=False)
    assert [(k, t) for k, _, _, t in per_micro] == [("reduce_scatter", 4), ("all_gather", 8)]


# -- calibration and the check -------------------------------------------------------------------------------

def test_runs_made_by_the_model_are_projected_exactly_from_one_and_two_ranks():
    runs = [_run(n) for n in (1, 2, 3, 4)]
    cal, check = P.held_out_split(r.world for r in runs)
    assert (cal, check) == ([1, 2], [3, 4])
    model = P.calibrate([r for r in runs if r.world in cal], LINK, ranks_per_node=8)
    assert model.sample_s == pytest.approx(0.004) and model.exposure == pytest.approx(0.8)
    for _, point, err in P.errors(model, [r for r in runs if r.world in check]):
        assert abs(err) < 1e-9, (point.world, err)


def test_the_projection_fails_if_it_ignores_the_measured_communication_share():
    runs = [_run(n, exposure=1.0) for n in (1, 2, 3, 4)]
    assert runs[3].sync_share > 0.2  # communication is a large share of the 4-rank step
    model = P.calibrate(runs[:2], None)  # the link from the runs' own exposed sync
    [(_, _, err3), (_, p4, err4)] = P.errors(model, runs[2:])
    assert abs(err3) < 0.01 and abs(err4) < 0.01
    # What ignoring it would give: the 4-rank step without communication is more than 10% off.
    assert p4.step_s - p4.comm_s < 0.9 * runs[3].step_s
    # With a measured link the exposure is the measured share over the modelled cost: double the share measured
    # at 2 ranks, and the projected communication at 4 ranks doubles.
    fitted = P.calibrate(runs[:2], LINK)
    doubled = replace(runs[1], sync_share=2 * runs[1].sync_share)
    refit = P.calibrate([runs[0], doubled], LINK)
    assert P.project(refit, 4).comm_s == pytest.approx(2 * P.project(fitted, 4).comm_s)


def test_two_synchronising_world_sizes_fit_latency_and_bandwidth():
    runs = [_run(n, exposure=1.0) for n in (2, 3, 4)]
    link = P.self_measured_link(runs[:2])
    assert link is not None and link.latency_s == pytest.approx(LINK.latency_s)
    assert link.bus_gbps == pytest.approx(LINK.bus_gbps)


def test_ranks_sharing_a_hosts_cores_are_projected_with_the_contention():
    runs = [_run(n, cores=2) for n in (1, 2, 3, 4)]
    assert P.contention(4, "cpu", 2) == 2.0 and P.contention(4, "cuda", 2) == 1.0
    model = P.calibrate(runs[:2], LINK, ranks_per_node=4)
    errs = [err for _, _, err in P.errors(model, runs[2:])]
    assert max(map(abs, errs)) < 1e-9
    blind = replace(model, base=replace(model.base, cores=None))  # a model that forgets the shared cores
    assert P.errors(blind, runs[3:])[0][2] > 0.3


def test_a_sharded_optimizer_step_shrinks_with_the_world():
    runs = [_run(n, strategy="zero1", opt_s=0.03) for n in (1, 2, 4)]
    model = P.calibrate(runs[:2], LINK)
    assert model.optimizer_s == pytest.approx(0.03)
    assert abs(P.errors(model, runs[2:])[0][2]) < 1e-9


def test_efficiency_hours_and_cost_in_both_modes():
    model = P.calibrate([_run(1), _run(2)], LINK, ranks_per_node=8)
    one = P.project(model, 1, P.FIXED_GLOBAL, price=2.0)
    assert one.efficiency == pytest.approx(1.0)
    assert one.device_hours == pytest.approx(100 * one.step_s / 3600)
    assert one.cost == pytest.approx(2 * one.device_hours)
    g8, w8 = P.project(model, 8, P.FIXED_GLOBAL), P.project(model, 8, P.FIXED_PER_RANK)
    assert g8.samples_per_rank == 12 and w8.samples_per_rank == 96
    assert g8.efficiency == pytest.approx(one.step_s / (8 * g8.step_s))
    assert w8.efficiency == pytest.approx(one.step_s / w8.step_s)
    # the same samples either way: weak scaling runs fewer, longer steps
    assert w8.device_hours == pytest.approx(100 * 96 / (8 * 96) * w8.step_s * 8 / 3600)
    assert not P.project(model, 128, P.FIXED_GLOBAL).feasible  # 96 samples cannot feed 128 ranks


def test_the_largest_efficient_world_is_where_efficiency_first_drops_below_the_goal():
    model = P.calibrate([_run(1), _run(2)], LINK, ranks_per_node=8)
    best = P.largest_efficient(model, P.FIXED_GLOBAL, 64)
    assert best is not None and P.project(model, best, P.FIXED_GLOBAL).efficiency >= 0.9
    assert P.project(model, best + 1, P.FIXED_GLOBAL).efficiency < 0.9
    # weak scaling hides more: the per-rank work stays while the communication grows slowly
    assert (P.largest_efficient(model, P.FIXED_PER_RANK, 64) or 0) >= best


def test_without_a_synchronising_run_or_a_link_nothing_prices_communication():
    with pytest.raises(P.Unpriced, match="no run of the fit timed its gradient sync, and no link was measured"):
        P.calibrate([_run(1)], None)
    model = P.calibrate([_run(1)], LINK)  # a link measured: no overlap assumed, and said
    assert model.exposure == 1.0 and any("ρ = 1" in n for n in model.notes)


def test_one_rank_without_the_ddp_wrapper_is_fitted_apart_from_the_others():
    runs = [_run(n, single_s=0.003) for n in (1, 2, 3, 4)]  # DDP's hooks cost a quarter more per sample
    model = P.calibrate(runs[:2], LINK)
    assert model.single_sample_s == pytest.approx(0.003) and model.sample_s == pytest.approx(0.004)
    assert max(abs(err) for _, _, err in P.errors(model, runs)) < 1e-9  # the fitted runs too: one rank included
    pooled = replace(model, sample_s=(0.003 + 0.004) / 2, single_sample_s=None)  # one figure for both
    assert P.errors(pooled, runs[3:])[0][2] > 0.1


# -- the model's arithmetic (issue 52 item 9) ----------------------------------------------------------------

def test_a_collective_over_n_ranks_takes_the_ceiling_of_log2_n_hops():
    assert [P.hops(n) for n in (1, 2, 3, 4, 5, 8, 9, 511, 512, 513)] == [0, 1, 2, 2, 3, 3, 4, 9, 9, 10]
    assert P.hops(2**60 + 1) == 61  # integers: no logarithm's rounding
    # fit_link divides the intercept by the hops: 3 ranks' latency is two hops' worth
    rows = [{"bytes": b, "time_us": 1e6 * P.collective_s("all_reduce", b, 3, LINK)} for b in (1 << 20, 1 << 26)]
    fitted = P.fit_link(rows, 3)
    assert fitted is not None and fitted.latency_s == pytest.approx(LINK.latency_s)


@pytest.mark.parametrize(("worlds", "priced", "split"), [
    ([1, 2, 3], False, ([1, 2], [3])),        # an odd count: the smaller half rounded up fits
    ([1, 2, 3, 4], False, ([1, 2], [3, 4])),
    ([4], False, ([4], [])),                  # one world size calibrates on itself
    ([1], True, ([1], [])),
    ([1, 2], True, ([1], [2])),               # a measured link prices 2 from 1: the GPU check
    ([1, 2], False, ([1, 2], [])),            # else the fit needs the 2-rank run, and nothing is left to check
    ([2, 4], False, ([2], [4])),
])
def test_the_default_split_of_measured_world_sizes(worlds, priced, split):
    assert P.held_out_split(worlds, priced) == split


def test_a_measured_row_shows_the_run_not_the_model():
    runs = [_run(n) for n in (1, 2)]
    three = replace(_run(3), step_s=0.9 * _run(3).step_s)  # faster than the model says
    model = P.calibrate(runs, LINK)
    assert P.measured_modes(model, three) == (P.FIXED_GLOBAL,)
    assert P.measured_modes(model, runs[0]) == (P.FIXED_GLOBAL, P.FIXED_PER_RANK)
    pt = P.measured_point(model, three, P.FIXED_GLOBAL, runs[0].step_s, price=2.0)
    assert pt.step_s == three.step_s and pt.rate == pytest.approx(96 * 64 / three.step_s)
    assert pt.comm_s == pytest.approx(three.sync_share * three.step_s)
    assert pt.efficiency == pytest.approx(runs[0].step_s / (3 * three.step_s))
    assert pt.device_hours == pytest.approx(100 * three.step_s * 3 / 3600)  # the base run's 100 steps of 96
    assert pt.cost == pytest.approx(2 * pt.device_hours)
    assert pt.rate > 1.05 * P.measured_at(model, three).rate
    assert math.isnan(P.measured_point(model, three, P.FIXED_GLOBAL, None).efficiency)
