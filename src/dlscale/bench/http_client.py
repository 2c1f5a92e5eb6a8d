"""An Open Inference Protocol REST client: binary tensors, pooled keep-alive connections.

It speaks plain OIP so that it measures any conformant server the same way (dlscale, Triton,
MLServer, KServe): binary tensor data only when the server advertises `binary_tensor_data`,
JSON otherwise; extensions such as `/config` or `/stats` are optional and their absence is
not an error.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import numpy as np

from dlscale.errors import BenchError, InvalidInput
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire.rest import decode_response, encode_request

_HEADER_LENGTH = "Inference-Header-Content-Length"


class HttpClient:
    """One pooled aiohttp session to one server; create, `await open()`, use, `await close()`."""

    def __init__(self, base_url: str, connections: int = 64, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.connections = connections
        self.timeout_s = timeout_s
        #: Tensors as binary data: when the server advertises the extension (`open` reads it).
        self.binary = False
        self.server: dict[str, Any] = {}
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Connect, check the server is live, and read its metadata (name, extensions)."""
        connector = aiohttp.TCPConnector(limit=self.connections, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        )
        try:
            status, _ = await self._get("/v2/health/live")
            if status != 200:
                raise BenchError(f"{self.base_url} answers /v2/health/live with HTTP {status}")
            status, body = await self._get("/v2")
            self.server = body if status == 200 and isinstance(body, dict) else {}
        except BaseException:
            await self.close()
            raise
        self.binary = "binary_tensor_data" in self.server.get("extensions", [])

    async def close(self) -> None:
        """Close the pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's metadata; BenchError naming the server when it has no such model."""
        status, body = await self._get(self._model_path(model, version))
        if status != 200:
            raise BenchError(
                f"{self.base_url} has no ready model {model!r} (HTTP {status}: {_message(body)})"
            )
        if not isinstance(body, dict):
            raise BenchError(f"{self.base_url}: model metadata of {model!r} is not a JSON object")
        return body

    async def model_config(self, model: str, version: str = "") -> dict[str, Any] | None:
        """The model's configuration when the server offers it (Triton, dlscale), else None."""
        status, body = await self._get(self._model_path(model, version) + "/config")
        return body if status == 200 and isinstance(body, dict) else None

    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        """The statistics extension's JSON for the model, or None when not offered."""
        status, body = await self._get(self._model_path(model, version) + "/stats")
        return body if status == 200 and isinstance(body, dict) else None

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], version: str = ""
    ) -> dict[str, np.ndarray]:
        """Run one request and return every output; BenchError with the server's message."""
        request = InferenceRequest(model, inputs, model_version=version)
        return (await self.infer_request(request)).outputs

    async def infer_request(self, request: InferenceRequest) -> InferenceResponse:
        """Run one request as given (inputs or outputs may be in shared-memory regions)."""
        url = self.base_url + self._model_path(request.model_name, request.model_version)
        url += "/infer"
        try:
            encoded = encode_request(request, self.binary)
        except (InvalidInput, ValueError) as exc:
            raise BenchError(f"{url}: cannot send the inputs: {exc}") from None
        headers = {"Content-Type": "application/json"}
        if encoded.header_length is not None:
            headers = {
                "Content-Type": "application/octet-stream",
                _HEADER_LENGTH: str(encoded.header_length),
            }
        payload, header_len = await self._post(url, b"".join(encoded.parts), headers)
        placed = {o.name: o.region for o in request.outputs or () if o.region is not None}
        try:
            return decode_response(payload, int(header_len) if header_len else None, placed)
        except (InvalidInput, ValueError) as exc:
            raise BenchError(f"{url}: the answer cannot be read: {exc}") from None

    async def register_region(self, kind: str, name: str, memory: Any) -> None:
        """Register a region the bench made (shared_memory.HostBuffer or DeviceBuffer)."""
        if kind == "system":
            body: dict[str, Any] = {"key": memory.key, "offset": 0, "byte_size": memory.byte_size}
        else:
            handle = base64.b64encode(memory.handle).decode()
            body = {
                "raw_handle": {"b64": handle},
                "device_id": memory.device_id,
                "byte_size": memory.byte_size,
            }
        path = f"/v2/{kind}sharedmemory/region/{name}/register"
        await self._post(self.base_url + path, json.dumps(body).encode())

    async def unregister_region(self, kind: str, name: str) -> None:
        """Unregister a region by name."""
        path = f"/v2/{kind}sharedmemory/region/{name}/unregister"
        await self._post(self.base_url + path, b"{}")

    # -- internals -----------------------------------------------------------------------------

    def _require(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise BenchError("the HTTP client is not open")
        return self._session

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[bytes, str | None]:
        """The answer's body and its binary header length; BenchError unless HTTP 200."""
        session = self._require()
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                status, payload = resp.status, await resp.read()
                header_len = resp.headers.get(_HEADER_LENGTH)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BenchError(f"{url}: {type(exc).__name__}: {exc}") from None
        if status != 200:
            raise BenchError(f"{url}: HTTP {status}: {_message(_json(payload))}")
        return payload, header_len

    async def _get(self, path: str) -> tuple[int, Any]:
        session = self._require()
        try:
            async with session.get(self.base_url + path) as resp:
                return resp.status, _json(await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BenchError(
                f"cannot reach {self.base_url} ({type(exc).__name__}: {exc or 'no answer'}); "
                "is the server running?"
            ) from None


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload) if payload else None
    except (ValueError, UnicodeDecodeError):
        return payload[:200].decode(errors="replace")


def _message(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return str(body)[:300]
