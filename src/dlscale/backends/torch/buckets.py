"""Batch-size buckets: a batch is padded up to the next bucket and the padding dropped after."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from dlscale.errors import ConfigError, InvalidInput


def default_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to `max_batch_size`, and `max_batch_size` itself when it is not one."""
    if max_batch_size < 1:
        raise ConfigError(
            "batch buckets need a batched model (max_batch_size > 0) or an explicit batch_buckets"
        )
    # 2**i is below max_batch_size exactly while i < (max_batch_size - 1).bit_length().
    powers = [2**i for i in range((max_batch_size - 1).bit_length())]
    return (*powers, max_batch_size)


class Buckets:
    """The batch sizes a model is compiled or captured for, ascending."""

    def __init__(self, sizes: Sequence[int]) -> None:
        ordered = sorted(set(sizes))
        if not ordered or ordered[0] < 1:
            raise ConfigError(f"batch_buckets {list(sizes)}: give positive batch sizes")
        self.sizes: tuple[int, ...] = tuple(ordered)

    @property
    def largest(self) -> int:
        """The biggest batch a call may carry."""
        return self.sizes[-1]

    def pick(self, rows: int) -> int:
        """The smallest bucket that holds `rows` rows."""
        if rows < 1:
            raise InvalidInput("a batch needs at least one row")
        index = bisect.bisect_left(self.sizes, rows)
        if index == len(self.sizes):
            raise InvalidInput(
                f"a batch of {rows} rows is above the largest batch bucket {self.largest}"
            )
        return self.sizes[index]

    def __repr__(self) -> str:
        return f"Buckets({list(self.sizes)})"


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` grown to `rows` rows along dim 0 with zeros (returned as is when it has them).

    Zeros rather than copies of a real row: every row of a batch is computed independently by
    the models served here (BatchNorm in eval mode, attention within a row), so the padding
    values cannot change the real rows, and zeros are valid indices for embedding inputs.
    """
    have = tensor.shape[0]
    if have == rows:
        return tensor
    if have > rows:
        raise InvalidInput(f"cannot pad a batch of {have} rows down to {rows}")
    padded = tensor.new_zeros((rows, *tensor.shape[1:]))
    padded[:have] = tensor
    return padded
