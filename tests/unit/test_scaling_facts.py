"""summary.json's scaling_facts (tasks/engine/scaling_facts.py): the bytes a step's collectives move under each
strategy and precision, and the rank's threads and cores."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from ddp_runner.contract import scaling
from ddp_runner.tasks.engine import scaling_facts


def _params() -> list[torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))
    model[1].bias.requires_grad_(False)  # frozen: never reduced
    return [p for p in model.parameters() if p.requires_grad]


def test_gradient_bytes_follow_the_wire_dtype_of_each_strategy():
    numel = 10 * 20 + 20 + 20 * 5
    ddp = scaling_facts.of(_params(), "ddp", {"ddp_comm": "fp32", "precision": "bf16"})
    assert ddp[scaling.TRAINABLE] == numel and ddp[scaling.GRAD_BYTES] == 4 * numel
    assert scaling_facts.of(_params(), "zero1", {"ddp_comm": "bf16"})[scaling.GRAD_BYTES] == 2 * numel
    fsdp = scaling_facts.of(_params(), "fsdp", {"precision": "bf16"})  # fp32 reduce, bf16 gathers
    assert (fsdp[scaling.GRAD_BYTES], fsdp[scaling.PARAM_BYTES]) == (4 * numel, 2 * numel)
    assert scaling_facts.of(_params(), "fsdp", {"precision": "fp32"})[scaling.PARAM_BYTES] == 4 * numel


def test_the_summary_entry_names_the_rank_share_of_the_host(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    cfg = OmegaConf.create({"strategy": {"name": "ddp"}, "train": {"ddp_comm": "fp32"}})
    facts = scaling_facts.entry(_params(), cfg)[scaling.SUMMARY_KEY]
    assert facts[scaling.LOCAL_WORLD] == 3 and facts[scaling.THREADS] == torch.get_num_threads()
    assert facts[scaling.CORES] >= 1
