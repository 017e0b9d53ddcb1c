"""The driver's torch probe (runner/config/probe.py): one subprocess, its answer cached under the output root for the
next job with the same task and model, and nothing written for a refused plan or a dry run. Here, in process: the
driver's answers without a subprocess and a refused plan through main(); through the CLI: test_probe_e2e.py."""

from __future__ import annotations


def test_the_driver_answers_gpt_and_inductor_questions_without_a_subprocess(tmp_path):
    from ddp_runner.job import planning

    cfg = {"task": {"name": "gpt", "module": "ddp_runner.tasks.gpt.task", "checks": "ddp_runner.tasks.gpt.checks",
                    "model": {"layers": 2, "heads": 2, "width": 64, "context": 64, "vocab": 256}},
           "data": {"name": "text"}, "device": "cpu", "strategy": {"memory_cap_gb": 1},
           "train": {"inductor": {"triton": {"cudagraphs": False}}}, "output": {"root": str(tmp_path)}}
    probe = planning.start_probe(cfg, None)
    assert probe.proc is None and set(probe.result()) == {"model", "inductor"}
    assert probe.result()["inductor"] == {"triton.cudagraphs": True}  # a boolean setting (its placeholder)
    smoke = {**cfg, "task": {"name": "smoke", "module": "ddp_runner.tasks.smoke",
                             "checks": "ddp_runner.tasks.smoke_checks",
                             "in_features": 8, "out_features": 1}, "data": {"name": "synthetic", "num_samples": 8,
                                                                            "seed": 0}}
    probe = planning.start_probe(smoke, None)
    assert probe.proc is not None, "the smoke task has no memory_facts: torch counts its model"
    assert probe.result()["model"]["params"] == 9


def test_a_refused_plan_writes_nothing(tmp_path, cli):
    r = cli(["task=gpt", "device=cpu", "world_size=1", "strategy.memory_cap_gb=0.001"], tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert not (tmp_path / "out").exists()
