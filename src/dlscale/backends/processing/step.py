"""What every processing step is as a Backend: its folder, options and named tensors; and, for
the steps that read BYTES rows, a batch taken request by request so that a bad row fails only
its own request."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from dlscale.backends.base import BackendOptions, Capabilities, RequestResult
from dlscale.backends.processing.options import byte_rows
from dlscale.errors import ConfigError, DlscaleError
from dlscale.types import TensorSpec

Row = TypeVar("Row")


class Step:
    """The Backend protocol's common part; a step sets `inputs` and `outputs` in __init__."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options

    def _needs_rows(self, step: str, rows: str) -> None:
        """A step batches its rows: a config without a batch dimension is refused."""
        if self.options.max_batch_size < 1:
            raise ConfigError(f"{step} step: max_batch_size must be at least 1 (rows are {rows})")


class RowsStep(Step):
    """A step whose batch comes request by request (`Capabilities.takes_requests`)."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(takes_requests=True)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        (result,) = self.infer_requests([inputs])
        if isinstance(result, DlscaleError):
            raise result
        return result

    def infer_requests(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[RequestResult]:
        raise NotImplementedError

    def _rows(
        self, requests: Sequence[Mapping[str, np.ndarray]], row: Callable[[object, int], Row]
    ) -> tuple[list[Row], list[range | DlscaleError]]:
        """The rows of the step's one input over all the requests, each made by `row` (from the
        element and its index in its request), and each request's range of them, or the error
        of a row that fails it (that request alone)."""
        name = self.inputs[0].name
        made: list[Row] = []
        spans: list[range | DlscaleError] = []
        for request in requests:
            try:
                mine = [row(element, i) for i, element in enumerate(byte_rows(request[name], name))]
            except DlscaleError as exc:
                spans.append(exc)
                continue
            spans.append(range(len(made), len(made) + len(mine)))
            made.extend(mine)
        return made, spans
