"""DistributedSampler that can start part-way through an epoch, so a resumed run sees the same samples."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data.distributed import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """A :class:`DistributedSampler` whose next epoch may skip its first ``start`` indices.

    The permutation depends only on ``seed + epoch``, so skipping reproduces an interrupted epoch exactly.
    """

    start: int = 0

    def set_start(self, start: int) -> None:
        """Skip the first ``start`` indices of this rank's share in the coming iteration."""
        self.start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())[self.start:]
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples - self.start
