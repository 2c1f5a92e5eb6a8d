"""What a benchmark measures: an in-process model or an OIP server, behind one async interface."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import SplitResult, urlsplit

import numpy as np

from dlscale.bench.grpc_client import GrpcClient
from dlscale.bench.http_client import HttpClient
from dlscale.bench.shared_memory import RegionPool
from dlscale.errors import BenchError, ConfigError, DlscaleError
from dlscale.models.repository import ModelRepository
from dlscale.models.signature import onnx_signature as read_onnx_signature
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import Datatype, InferenceRequest, TensorSpec
from dlscale.wire.documents import as_document, config_message, statistics_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the bench knows of the model it drives: tensors and whether requests may batch."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batched: bool
    #: The largest batch one request may carry; None when the server does not say.
    max_batch_size: int | None = None
    platform: str = ""
    #: The model file when the bench can read it (in-process targets): FLOPs, reference.
    model_file: Path | None = None
    #: Devices of the instances (in-process targets; empty when unknown).
    devices: tuple[str, ...] = ()

    def sample_specs(self) -> tuple[TensorSpec, ...]:
        """Inputs of one sample: the batch dimension left out when the model batches."""
        if not self.batched:
            return self.inputs
        return tuple(TensorSpec(s.name, s.datatype, s.shape[1:]) for s in self.inputs)

    def batch_limit(self, wanted: int) -> int:
        """`wanted` rows, or fewer when the model caps requests below it (1 when unbatched)."""
        if not self.batched:
            return 1
        return min(wanted, self.max_batch_size) if self.max_batch_size else wanted


#: Cumulative measured service time per batch size: {batch size: (batches, total ns)}.
BatchTimes = dict[int, tuple[int, int]]


class Target(Protocol):
    """One model served somewhere; every call runs on the bench's event loop."""

    kind: str
    label: str

    async def open(self) -> ModelInfo: ...

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    async def batch_times(self) -> BatchTimes | None: ...

    async def model_config(self, model: str) -> dict[str, Any] | None: ...

    async def statistics(self, model: str) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class InProcessTarget:
    """A repository model behind the same ModelManager, Batcher and DataPlane as the server.

    With `manager`, the model loads into that one, beside the models it already serves (their
    instances then share devices and device gates); closing leaves the manager to its owner.
    """

    kind = "inprocess"

    def __init__(
        self, repo: Path, model: str, version: str = "", manager: ModelManager | None = None
    ) -> None:
        self.repo = Path(repo)
        self.model = model
        self.version = version
        self.label = f"in-process:{self.repo}"
        self._shared = manager
        self._manager: ModelManager | None = None
        self._dataplane: DataPlane | None = None

    async def open(self) -> ModelInfo:
        """Load the one model (not the whole repository) and describe it."""
        try:
            repository = ModelRepository(self.repo)
        except DlscaleError as exc:
            raise BenchError(str(exc)) from None
        if self.model not in repository.names():
            raise BenchError(
                f"no model {self.model!r} in the repository {self.repo} "
                f"(models: {', '.join(repository.names()) or 'none'})"
            )
        self._manager = self._shared or ModelManager(repository)
        try:
            await self._manager.load(self.model)
        except DlscaleError as exc:
            raise BenchError(f"model {self.model!r} cannot be loaded: {exc}") from None
        self._dataplane = DataPlane(self._manager)
        self._manager.calls.connect(self._dataplane.call_paths())  # BLS: this target's path
        served = self._manager.get(self.model, self.version)
        return ModelInfo(
            name=self.model,
            inputs=tuple(served.inputs),
            outputs=tuple(served.outputs),
            batched=served.config.batched,
            max_batch_size=served.config.max_batch_size or None,
            platform=served.config.platform_name,
            model_file=served.version.model_file,
            devices=tuple(g.device for g in served.config.instances),
        )

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request through the DataPlane (validation, batcher, statistics)."""
        if self._dataplane is None:
            raise BenchError("the in-process target is not open")
        request = InferenceRequest(self.model, inputs, model_version=self.version)
        return (await self._dataplane.infer(request)).outputs

    async def batch_times(self) -> BatchTimes | None:
        """The batcher's compute time per batch size since the model was loaded."""
        if self._manager is None:
            return None
        stats = self._manager.get(self.model, self.version).stats
        return {
            size: (d.compute_infer.count, d.compute_infer.ns)
            for size, d in stats.batch_stats.items()
        }

    async def model_config(self, model: str) -> dict[str, Any] | None:
        """A loaded model's config as the REST API shows it (None when it is not loaded)."""
        if self._dataplane is not None:
            with contextlib.suppress(DlscaleError):
                return as_document(config_message(self._dataplane.model_config(model)))
        return None

    async def statistics(self, model: str) -> dict[str, Any] | None:
        """A loaded model's statistics as the REST API shows them (None when not loaded)."""
        if self._dataplane is not None:
            with contextlib.suppress(DlscaleError):
                return as_document(statistics_message(self._dataplane.statistics(model)))
        return None

    async def close(self) -> None:
        """Unload the model (in-flight requests finish first)."""
        if self._manager is not None and self._shared is None:
            await self._manager.close()
        self._manager = None


def _url_parts(url: str) -> SplitResult | None:
    """The URL's parts, None where Python refuses them: an unclosed `[` of an IPv6 address, a
    port that is not a number or above 65535 (read here, or it would raise later)."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return None
    return parts


class RemoteTarget:
    """A model on an Open Inference Protocol server, over HTTP or gRPC."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str = "",
        connections: int = 64,
        shared_memory: str = "none",
        output_shm_size: int | None = None,
    ) -> None:
        parts = _url_parts(url)
        if parts is None or parts.scheme not in ("http", "https", "grpc") or not parts.hostname:
            raise BenchError(
                f"target {url!r}: expected http://HOST:PORT, https://HOST:PORT or grpc://HOST:PORT"
            )
        self.kind = "grpc" if parts.scheme == "grpc" else "http"
        self.label = url
        self.model = model
        self.version = version
        #: Inputs and outputs to assume when the server's metadata lists none (a local file's).
        self.declared: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] = ((), ())
        #: Tensors through shared-memory regions (system or cuda) instead of the messages.
        self.shared_memory = shared_memory
        self.output_shm_size = output_shm_size
        self._regions: RegionPool | None = None
        self._client: HttpClient | GrpcClient = (
            GrpcClient(parts.netloc)
            if self.kind == "grpc"
            else HttpClient(f"{parts.scheme}://{parts.netloc}", connections=connections)
        )

    async def open(self) -> ModelInfo:
        """Connect, then read the model's metadata (and its config when the server has one)."""
        client = self._client
        await client.open()
        meta = await client.model_metadata(self.model, self.version)
        config = await client.model_config(self.model, self.version)
        inputs = tuple(_spec(t) for t in meta.get("inputs", []))
        outputs = tuple(_spec(t) for t in meta.get("outputs", []))
        if not inputs:
            # Plain OIP lets a server leave them out (MLServer does unless model-settings.json
            # lists them); the session then takes them from the local model file or the data.
            inputs, outputs = self.declared
            if not inputs:
                raise BenchError(
                    f"{self.label}: model {self.model!r} declares no inputs in its metadata; "
                    "give --repo (or --reference) with the model file, or --data FILE.npz"
                )
        if self.shared_memory != "none":
            self._regions = RegionPool(self.shared_memory, client, outputs, self.output_shm_size)
        max_batch = config.get("max_batch_size") if config else None
        if isinstance(max_batch, int):
            batched = max_batch > 0
        else:
            # Plain OIP does not say; a leading -1 on every input is the batch convention.
            batched = all(s.shape and s.shape[0] == -1 for s in inputs)
            max_batch = None
        return ModelInfo(
            name=self.model,
            inputs=inputs,
            outputs=outputs,
            batched=batched,
            max_batch_size=max_batch or None,
            platform=str(meta.get("platform", "")),
        )

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request over the wire (its tensors in shared memory when asked)."""
        if self._regions is not None:
            return await self._regions.infer(self.model, inputs, self.version)
        request = InferenceRequest(self.model, inputs, model_version=self.version)
        return (await self._client.infer_request(request)).outputs

    async def batch_times(self) -> BatchTimes | None:
        """Per-batch-size compute time from the statistics extension, when the server has it."""
        stats = await self._client.statistics(self.model, self.version)
        entries = (stats or {}).get("model_stats") or []
        if not entries:
            return None
        out: BatchTimes = {}
        for row in entries[0].get("batch_stats", []):
            infer = row.get("compute_infer", {})
            out[int(row["batch_size"])] = (int(infer.get("count", 0)), int(infer.get("ns", 0)))
        return out

    async def model_config(self, model: str) -> dict[str, Any] | None:
        """Any model's config from the server, when it offers the extension."""
        return await self._client.model_config(model)

    async def statistics(self, model: str) -> dict[str, Any] | None:
        """Any model's statistics from the server, when it offers the extension."""
        return await self._client.statistics(model)

    async def close(self) -> None:
        """Unregister and destroy the regions, then close the connections."""
        try:
            if self._regions is not None:
                await self._regions.close()
        finally:
            await self._client.close()


def _spec(tensor: dict[str, Any]) -> TensorSpec:
    try:
        return TensorSpec.from_dict(tensor)
    except (KeyError, ValueError):
        raise BenchError(f"tensor metadata {tensor} has no valid name, datatype or shape") from None


def local_signature(
    model_file: Path | None, data: Path | None
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The tensors to assume for a server whose metadata lists none: a local ONNX file's, read
    from its graph (weights are not loaded), else the inputs of a .npz data file (one array per
    input, samples first), else none."""
    if model_file is not None and model_file.suffix == ".onnx" and model_file.is_file():
        try:
            inputs, outputs = read_onnx_signature(model_file)
        except ConfigError as exc:
            raise BenchError(str(exc)) from None
        return tuple(inputs), tuple(outputs)
    if data is None or data.suffix != ".npz":
        return (), ()
    try:
        loaded = np.load(data, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BenchError(f"data file {data}: {exc}") from None
    if isinstance(loaded, np.ndarray):
        raise BenchError(f"{data}: a .npy file does not name its input; use .npz (name=array)")
    with loaded:
        arrays = {k: loaded[k] for k in loaded.files if k not in ("labels", "label")}
    specs = (
        TensorSpec(n, Datatype.from_numpy(a.dtype), (-1, *a.shape[1:])) for n, a in arrays.items()
    )
    return tuple(specs), ()
