"""Fixtures of the distributed tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group for the test's duration."""
    import torch.distributed as dist

    from tiermem.dist.train import _free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
