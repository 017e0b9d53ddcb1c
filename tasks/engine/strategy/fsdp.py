"""FSDP2, the sharded strategy: parameters, gradients and optimizer state split across ranks.

``fully_shard`` goes on every repeated block (each element of the model's ``nn.ModuleList``\\ s, the transformer
layers of a GPT) and then on the root, so one block's parameters are gathered at a time. Under ``train.compile``
each block is compiled on its own before it is sharded (FSDP2's hooks stay outside the compiled graphs, the
torchtitan recipe). With accumulation the non-final micro-steps neither reduce gradients nor free the gathered
parameters after the backward, so the next micro-step's forward needs no new all-gather; the final one does both.
That holds the whole unsharded model and its unsharded fp32 gradients during the step; with
``strategy.accumulate_unsharded=false`` every micro-step reduce-scatters and reshards instead (least memory).

Checkpoints are sharded: every rank writes its own shards through ``torch.distributed.checkpoint``
(``checkpoint/sharded.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from ddp_runner.tasks.engine.strategy.base import Strategy
from ddp_runner.tasks.engine.strategy.units import shard_units

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """Compute in ``train.precision`` (parameters gathered in bf16), reduce gradients and keep them in fp32."""
    dtype = PARAM_DTYPES.get(precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)


class FSDPStrategy(Strategy):
    """FSDP2 ``fully_shard`` per block and at the root (see
    :class:`~ddp_runner.tasks.engine.strategy.base.Strategy`)."""

    full_state_on_rank0 = False  # every rank holds a shard: saving is collective (checkpoint/sharded.py)
    sharded_checkpoint = True
    collective_forward = True    # every forward all-gathers the blocks' parameters
    cudagraphs = False           # FSDP2's all-gathers run between the compiled blocks: no whole-step graphs

    def __init__(self, model: torch.nn.Module, device: torch.device, local_rank: int, world_size: int,
                 train_cfg: Any, strategy_cfg: Any) -> None:
        t = train_cfg
        if t.precision == "fp16":
            raise ValueError("strategy=fsdp with train.precision=fp16: FSDP2 needs a sharded gradient scaler this"
                             " engine does not have. Fix: use train.precision=bf16 (or fp32)")
        self.model, self.world_size = model, world_size
        mesh = init_device_mesh(device.type, (world_size,))
        reshard = bool(strategy_cfg.get("reshard_after_forward", True))
        self.accumulate_unsharded = bool(strategy_cfg.get("accumulate_unsharded", True))
        kwargs = {"mesh": mesh, "mp_policy": mixed_precision(t.precision)}
        units = shard_units(model)
        compile_kwargs = {"mode": t.compile_mode} if t.get("compile_mode") else {}
        if compile_kwargs.get("mode") in ("reduce-overhead", "max-autotune"):
            # CUDA graphs cannot hold FSDP2's collectives; the same kernels without graphs.
            compile_kwargs["mode"] = "max-autotune-no-cudagraphs" if "autotune" in compile_kwargs["mode"] else None
            compile_kwargs = {k: v for k, v in compile_kwargs.items() if v is not None}
        for unit in units:
            if t.compile:
                unit.compile(**compile_kwargs)  # in place: same module, same parameter names
            fully_shard(unit, reshard_after_forward=reshard, **kwargs)
        # The root's parameters (embeddings, final norm, the tied head) are used last in the backward: keeping
        # them gathered after the forward saves one all-gather per micro-step for little memory.
        fully_shard(model, reshard_after_forward=False, **kwargs)
        self.fsdp: FSDPModule = model  # type: ignore[assignment]  # fully_shard changed its class in place
        self.params = [p for p in model.parameters() if p.requires_grad]

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Non-final micro-steps keep their gradients local (unreduced) and their parameters gathered, unless
        ``strategy.accumulate_unsharded`` is false (then every micro-step reduce-scatters: least memory)."""
        keep = not last and self.accumulate_unsharded
        self.fsdp.set_requires_gradient_sync(not keep)
        self.fsdp.set_reshard_after_backward(not keep)
        return contextlib.nullcontext()

    def forward(self, last: bool) -> Callable[..., torch.Tensor]:
        """The model itself (its blocks are compiled in place)."""
        return self.model

    def backward(self, scaled_loss: torch.Tensor, *, first: bool, last: bool) -> None:
        """Plain backward: FSDP2 accumulates into the sharded ``p.grad`` and reduce-scatters on the last one."""
        scaled_loss.backward()

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer, accumulation: int) -> None:
        """Gradients start from nothing each step (FSDP2 accumulates into existing ones)."""
        optimizer.zero_grad(set_to_none=True)

    def state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This rank's shards of model and optimizer state, keyed by parameter name (collective)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def load_state_dict(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """Load what :meth:`state_dict` returned, after ``torch.distributed.checkpoint`` filled it (collective)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
