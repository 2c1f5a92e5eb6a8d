"""TensorFlow Serving's REST API on the REST port, for every model: decode, one Plane call, encode.

`/v1/models/NAME[/versions/N]:predict|:classify|:regress`, `GET /v1/models/NAME[/versions/N]`
(status) and `.../metadata`; errors in its shape, `{"error": "..."}`. The OpenAI API shares the
`/v1/` prefix: `GET /v1/models/NAME` of a generative model, or of a name the server does not
serve, is OpenAI's `retrieve`, answered by the OpenAI routes as before (docs/tfserving.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from dlscale.errors import DlscaleError, NotFound
from dlscale.frontends.limits import Limits
from dlscale.frontends.offload import OFF_LOOP_BYTES, off_loop
from dlscale.frontends.plane import Asked
from dlscale.frontends.rest import tfserving_documents as documents
from dlscale.frontends.rest.responses import (
    ROUTE_CACHE_SIZE,
    Handler,
    RestResponse,
    json_response,
    path_parts,
)
from dlscale.frontends.tfserving import methods
from dlscale.frontends.tfserving.signature import (
    check_signature,
    statuses,
)
from dlscale.types import InferenceRequest, ModelKind, ModelMetadata
from dlscale.wire.tensors import Buffer

#: A route: handler, path arguments (model, version), the one method, its API group.
Route = tuple[Handler, list[str], str, str]
VERBS = ("predict", "classify", "regress")


class TfServingApi:
    """The TensorFlow Serving routes over a Plane: `route` finds a path's handler, and the REST
    API (api.py) checks its caller, its method and its body, and maps its errors, as for its own."""

    def __init__(self, plane: Asked, limits: Limits) -> None:
        self.plane = plane
        self.limits = limits
        self._routes: dict[str, Route] = {}

    def route(self, path: str) -> Route | None:
        """The route of a path, or None when it is not TensorFlow Serving's (under `/v1/`)."""
        if not path.startswith("/v1/"):
            return None
        # Clients repeat a few paths, asked twice each (before the body, then to answer).
        found = self._routes.get(path)
        if found is None:
            found = self._resolve(path)
            if found is not None:
                if len(self._routes) >= ROUTE_CACHE_SIZE:
                    self._routes.clear()
                self._routes[path] = found
        return found

    def _resolve(self, path: str) -> Route | None:
        parts = path_parts(path)[1:]
        if len(parts) < 2 or parts[0] != "models":
            return None
        name, verb = parts[-1], ""
        head, colon, tail = name.rpartition(":")
        if colon and tail in VERBS:
            parts[-1], verb = head, tail
        model, rest = parts[1], parts[2:]
        version = ""
        if rest[:1] == ["labels"] and len(rest) >= 2:
            return self._no_label, [model, rest[1]], "POST" if verb else "GET", "metadata"
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        if verb:
            if rest:
                return None
            return self.infer, [model, version, verb], "POST", "inference"
        if rest == ["metadata"]:
            return self._metadata, [model, version], "GET", "metadata"
        if rest:
            return None
        return self._status, [model, version], "GET", "health"

    def shared(self, route: Route) -> bool:
        """Whether the route is `GET /v1/models/NAME`, which OpenAI's API has too."""
        return route[0] == self._status and not route[1][1]

    async def openai_asks(self, route: Route) -> bool:
        """Whether a request of `route` is OpenAI's: `GET /v1/models/NAME` of a generative model,
        or of a name not served."""
        if not self.shared(route):
            return False
        try:
            meta = await self.plane.model_metadata(route[1][0])
        except DlscaleError:
            return True
        return meta.kind is ModelKind.GENERATIVE

    # -- inference ---------------------------------------------------------------------------------

    async def infer(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        model, version, verb = args
        meta = await self.plane.model_metadata(model, version)
        # Which outputs answer is known from the metadata: a model that cannot is refused first.
        plan = methods.classify_plan(meta) if verb == "classify" else None
        regress = methods.regress_output(meta) if verb == "regress" else ""
        decoded = await off_loop(len(body) > OFF_LOOP_BYTES, self._read, body, meta, verb)
        await check_signature(self.plane, decoded.signature, meta, version)
        response = await self.plane.infer(InferenceRequest(model, decoded.arrays, version))
        if verb == "predict":
            return RestResponse(200, [documents.predict_answer(response, decoded.rows)])
        rows = decoded.rows or 0
        if plan is not None:
            text = documents.classify_answer(methods.classifications(response, plan, rows))
        else:
            text = documents.regress_answer(methods.regressions(response, regress, rows))
        return RestResponse(200, [text])

    def _read(self, body: Buffer, meta: ModelMetadata, verb: str) -> documents.Decoded:
        doc = documents.read_document(body, verb)
        arrays = documents.predict_arrays if verb == "predict" else documents.example_arrays
        return arrays(doc, meta, self.limits.max_tensor_elements)

    async def _no_label(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        raise NotFound(
            f"model {args[0]!r} has no version labels ({args[1][:100]!r}): dlscale serves "
            "versions by number, /v1/models/NAME/versions/N"
        )

    # -- status and metadata -----------------------------------------------------------------------

    async def _status(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        rows = await self.plane.repository_index(False)
        return json_response(documents.status_document(statuses(args[0], args[1], rows)))

    async def _metadata(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        meta = await self.plane.model_metadata(args[0], args[1])
        return json_response(documents.metadata_document(meta, args[1]))
