"""What every processing step is as a Backend: its folder, options and named tensors; and, for
the steps that read BYTES rows, a batch taken request by request so that a bad row fails only
its own request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dlscale.backends.base import BackendOptions, Capabilities, RequestResult
from dlscale.errors import ConfigError, DlscaleError
from dlscale.types import TensorSpec


class Step:
    """The Backend protocol's common part; a step sets `_inputs` and `_outputs` in __init__."""

    _inputs: list[TensorSpec]
    _outputs: list[TensorSpec]

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = path
        self.options = options

    def _needs_rows(self, step: str, rows: str) -> None:
        """A step batches its rows: a config without a batch dimension is refused."""
        if self.options.max_batch_size < 1:
            raise ConfigError(f"{step} step: max_batch_size must be at least 1 (rows are {rows})")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)


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
