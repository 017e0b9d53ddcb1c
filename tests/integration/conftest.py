"""Fixtures only the integration tier uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def gloo_group() -> Iterator[None]:
    """A one-process gloo group: the real DDP wrapper and collectives, as a rank sees them."""
    import torch.distributed as dist

    from tests.support.ports import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
