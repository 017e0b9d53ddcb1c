"""train.compile_scope=blocks (tasks/engine/strategy/ddp_compile.py), and the compile cache every run under one
output root shares (tasks/engine/compile_cache.py): in process with a recording backend, then through the CLI with
inductor on the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ddp_runner.config.plan import make_plan
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.tasks.engine import compile_cache
from ddp_runner.tasks.engine.strategy.ddp import _SingleProcess
from ddp_runner.tasks.engine.strategy.ddp_compile import compiled_forwards, repeated_blocks
from ddp_runner.tasks.gpt.model import GPT


def test_blocks_scope_compiles_one_block_once_and_every_block_reuses_it():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(vocab=64, context=16, width=32, layers=4, heads=2)
    keys = list(model.state_dict())
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    wrapper = _SingleProcess(model)
    sync, local = compiled_forwards(wrapper, model, distributed=False, compile=True, split=True, scope="blocks",
                                    backend=backend)
    assert sync is wrapper and local is wrapper  # the model's own call; only its blocks are compiled
    assert len(repeated_blocks(model)) == 4
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    ref = GPT(vocab=64, context=16, width=32, layers=4, heads=2)
    ref.load_state_dict(model.state_dict())
    for _ in range(2):
        loss = sync(x, y)
        loss.backward()
    assert len(graphs) == 1, f"one block graph, reused by all four blocks and on the second step: {graphs}"
    assert loss.item() == pytest.approx(ref(x, y).item(), rel=1e-5)
    assert list(model.state_dict()) == keys  # checkpoints keep their keys (compiled in place, no _orig_mod)
    torch._dynamo.reset()


def test_only_the_outermost_module_lists_are_blocks():
    inner = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    block = torch.nn.Sequential(torch.nn.Linear(2, 2))
    block.parts = inner
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([block, torch.nn.Linear(2, 2)])
    assert repeated_blocks(model) == [block, model.layers[1]]


def test_an_unknown_scope_is_refused_and_a_model_without_blocks_compiles_whole(capsys):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="train.compile_scope='layers'"):
        compiled_forwards(model, model, distributed=False, compile=True, split=True, scope="layers")
    sync, _ = compiled_forwards(model, model, distributed=False, compile=True, split=True, scope="blocks",
                                backend="eager")
    # Compiled in place (one process: the same graph a DDP-wrapped model of another job traces).
    assert sync is model and model._compiled_call_impl is not None
    assert "compiling the whole model" in capsys.readouterr().out


@pytest.mark.parametrize("key, value", [("compile_scope", "layers"), ("compile_cache", "yes"),
                                        ("timing_every", -1), ("timing_every", 1.5)])
def test_the_plan_refuses_bad_compile_and_timing_settings(key, value):
    from test_plan import cfg

    with pytest.raises(PlanError) as e:
        make_plan(cfg(**{f"train__{key}": value}), [])
    assert e.value.key == f"train.{key}"
    for ok in ("model", "blocks"):
        make_plan(cfg(train__compile_scope=ok, train__timing_every=0), [])


def test_cache_dir_lives_under_a_local_root_and_on_the_host_for_a_remote_one(tmp_path, monkeypatch):
    assert compile_cache.cache_dir(str(tmp_path)) == str(tmp_path / layout.COMPILE_CACHE)
    assert compile_cache.cache_dir(f"file://{tmp_path}") == str(tmp_path / layout.COMPILE_CACHE)
    assert compile_cache.cache_dir("s3://bucket/runs") == os.path.expanduser("~/.cache/ddp-runner/compile")
    monkeypatch.chdir(tmp_path)
    assert compile_cache.cache_dir("outputs") == str(tmp_path / "outputs" / layout.COMPILE_CACHE)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    path = compile_cache.configure(str(tmp_path / "root"))
    assert Path(path).is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == path
    assert os.environ["TRITON_CACHE_DIR"] == os.path.join(path, "triton")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own wins
    assert compile_cache.configure(str(tmp_path / "root")) == str(tmp_path / "mine")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # inductor's own default is no choice
    assert compile_cache.configure(str(tmp_path / "root")) == path
