"""The override lists of the runs that several tests share (the session fixtures launch them; tests name them to
launch a variant or to check what a shared run was asked to do)."""

from __future__ import annotations

from pathlib import Path


def rank0_sleeps(seconds: float) -> list[str]:
    """Overrides that keep a run up without its ranks training flat out while a test watches it: rank 0 sleeps
    ``seconds`` after every step from step 1 on (the rehearsal ``slow`` fault) and the others wait for it in the
    next collective. A stop reaches a rank in that sleep or that wait as it would in a step."""
    return ["fault.kind=slow", "fault.rank=0", "fault.step=1", f"fault.slow_s={seconds}"]


# Two gloo ranks of the smoke task, a checkpoint every 2 of its 8 steps: the uninterrupted run that the recovery
# tests (test_resume, test_resume_fallback_e2e, test_remote, test_lease_e2e) compare against.
SMOKE_CKPT2 = ["task=smoke", "device=cpu", "world_size=2", "checkpoint.every_steps=2"]

# SMOKE_CKPT2 with rank 1 SIGKILLed after step 7: a failed run that holds step_4 and step_6 (keep_last 2). The tests
# that continue it (test_resume.py, test_resume_fallback_e2e.py) each continue a copy of their own (copy_run).
KILL_SMOKE = ["fault.kind=sigkill", "fault.rank=1", "fault.step=7"]

# The tiny GPT at one global batch (24) on 1, 2, 3 and 4 gloo ranks: one `-m` sweep, 12 steps, a synchronous
# checkpoint every 2. test_world_sizes.py (nothing assumes two ranks; a 3-rank kill resumes to its job's losses),
# test_equivalence.py (every world size reaches the same weights) and test_compare_e2e.py (the report over a
# fixed-global-batch sweep) read it. Validation on a sliver of the
# default corpus (its 10 % tail is ~19k windows: seconds per validation on a CPU).
GPT_WORLD_SWEEP = ["task=gpt", "device=cpu", "train.max_steps=12", "train.log_every=2", "batch.per_rank=2",
                   "batch.global=24", "data.val_fraction=0.002", "checkpoint.every_steps=2",
                   "checkpoint.async_save=false"]


def gpt_dropout_args(text_file: Path) -> list[str]:
    """The tiny GPT on ``text_file`` at 2 gloo ranks: 8 optimizer steps per epoch, 2 epochs (16 steps), a
    checkpoint every 4 (all kept). AdamW, cosine schedule with warmup, grad clipping: all of it must carry over
    through a checkpoint. Dropout: the model draws random numbers at every training step, so a resume is exact only
    if it restores each rank's RNG. Synchronous saves: a kill 3 steps after a save must find that save complete
    (with async_save the save can still be in flight when torchrun stops rank 0, and the resume then rightly starts
    from the one before). A logging window per step, no validation: the throughput figures are per step."""
    return ["task=gpt", "device=cpu", "world_size=2", f"data.path={text_file}", "batch.per_rank=4",
            "task.model.dropout=0.1", "train.max_steps=null", "train.epochs=2", "train.log_every=1",
            "train.val_every=0", "checkpoint.every_steps=4", "checkpoint.keep_last=0", "checkpoint.async_save=false",
            "seed=3"]


GPT_DROPOUT_STEPS = 16


def gpt_fsdp_args(text_file: Path) -> list[str]:
    """:func:`gpt_dropout_args` under ``strategy=fsdp`` in bf16 (the mixed-precision policy too)."""
    return [*gpt_dropout_args(text_file), "strategy=fsdp", "train.precision=bf16"]


# The tiny GPT on 2 gloo ranks for 30 optimizer steps under accumulation 2 (4 per rank × 2 ranks × 2 = 16), a
# validation every 10 steps, and torch.profiler asked for 5 steps after step 28 (training ends inside that window:
# steps 29 and 30 are traced). test_gpt.py (every scalar per optimizer step, the console, the x-axis under
# accumulation), test_goodput_global.py (goodput is global) and test_profiling_e2e.py (a trace cut short by the
# end of training) read it.
GPT_W2_STEPS = 30
GPT_W2 = ["task=gpt", "world_size=2", "device=cpu", "checkpoint.async_save=false", f"train.max_steps={GPT_W2_STEPS}",
          "train.val_every=10", "data.val_fraction=0.01", "batch.per_rank=4", "batch.accumulation=2",
          "train.profile.steps=5", "train.profile.start=28"]

# The tiny GPT on 2 gloo ranks from a local uint16 token file (ids up to 319, a fixed cycle of 300: the next token
# is predictable), in bf16 autocast, 20 steps, with torch.profiler tracing steps 3 and 4. test_gpt.py (uint16 data,
# bf16 on CPU) and test_profiling_e2e.py (a full traced window) read it.
GPT_BIN_VOCAB, GPT_BIN_PERIOD, GPT_BIN_STEPS = 320, 300, 20


def gpt_bin_args(path: Path) -> list[str]:
    """The tiny GPT on the uint16 token file ``path`` (the recipe above)."""
    return ["task=gpt", "world_size=2", "device=cpu", "checkpoint.async_save=false", f"data.path={path}",
            f"task.model.vocab={GPT_BIN_VOCAB}", f"train.max_steps={GPT_BIN_STEPS}", "train.lr=3e-3",
            "data.val_fraction=0.05", "train.precision=bf16", "train.profile.steps=2", "train.profile.start=2"]


# The tiny GPT of GPT_WORLD_SWEEP on 2 ranks, another learning rate, rank 1 raising at step 3 (a rehearsal fault),
# under a 5 s hang watchdog and a 90 s collective timeout: test_compare_e2e.py (a failed run in the report beside
# the sweep) and test_diagnostics_e2e.py (an exception attributed to its rank and class) read it.
GPT_FAILED = [*GPT_WORLD_SWEEP, "world_size=2", "train.lr=0.002", "fault.kind=exception", "fault.rank=1",
              "fault.step=3", "watchdog.timeout_s=5", "timeout_s=90"]

# A dry run of a 1-rank, 2-step smoke plan (the CLI's main() in process), then the command it printed typed as
# printed into a shell (the console script beside this interpreter, else the one on PATH): test_dry_run_e2e.py
# checks that the launch was that plan; test_cli.py re-runs the run directory from its own config.
SMOKE_W1_DRY = ["task=smoke", "device=cpu", "world_size=1", "train.max_steps=2", "dry_run=true"]
DRY_RUN_SAYS = "ddp-run: dry run, nothing launched. To launch this plan, run:"

# One sequential smoke sweep on 1 and 2 ranks at a global batch of 24 (which 2 ranks of 8 cannot make: those two
# jobs are refused), two learning rates, 3 steps each: test_compare_e2e.py (a sweep records every job, a refused
# one too) and test_sweep_parallel.py (its 1-rank jobs are the sequential twins of the concurrent Optuna trials).
SMOKE_LR_SWEEP = ["task=smoke", "device=cpu", "batch.global=24", "train.max_steps=3", "sweep.objective=final_loss"]
SMOKE_LR_SWEEP_LRS = ("0.01", "0.05")

# SMOKE_CKPT2 with asynchronous saves, rank 0's background write of step_4 held for 8 s (a wide margin on a busy
# machine) and rank 1 out of memory at step 5 (the rehearsal OOM, an exception on CPU): rank 0 goes on into step 6's
# collective, which fails, and finishes the write on its way out. test_resume.py (the checkpoint in flight is
# finished) and test_diagnostics_e2e.py (an OOM attributed to its rank and class) read it.
SMOKE_OOM_IN_FLIGHT = [*SMOKE_CKPT2, "checkpoint.async_save=true", "fault.kind=oom", "fault.rank=1", "fault.step=5"]
SLOW_SAVE_STEP4 = {"DDP_RUNNER_SLOW_SAVE": "4:8"}

# The tiny GPT of GPT_WORLD_SWEEP on 2 ranks under strategy=zero1 in fp32, every checkpoint kept (test_strategies.py's
# recipe), rank 0 SIGKILLed after step 7 (the newest complete checkpoint: step_6). test_strategies.py (a copy of it
# resumed in place is bit-identical to the uninterrupted zero1 run) and test_diagnostics_e2e.py (a SIGKILLed rank 0
# is named, not rank 1 that it left waiting) read it.
GPT_ZERO1 = [*GPT_WORLD_SWEEP, "world_size=2", "checkpoint.keep_last=0", "strategy=zero1"]
GPT_ZERO1_KILL0 = [*GPT_ZERO1, "train.precision=fp32", "fault.kind=sigkill", "fault.rank=0", "fault.step=7"]
