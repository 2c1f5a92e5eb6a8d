"""The OpenAI routes on the REST port: decode, one Plane call, encode; errors in OpenAI's shape.

Every request of a route under `/v1/` comes here from the REST routes (frontends/rest/api.py):
the API group "openai" may need the API key (`--api-key`) or be restricted
(`--http-restricted-api`), and a refusal answers 401 as OpenAI's servers do. A generation is
the Plane's `stream`: the model's own queue, priorities and deadlines, shared with the Open
Inference Protocol. Its first response is awaited
before the answer's status is sent, so that a request the model refuses (too long a prompt,
settings out of bounds) gets its 4xx; after that, a failure is an error event, then `[DONE]`.
Leaving the stream early, a client that disconnected, closes the Plane's iterator, which frees
the sequence in the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson

from dlscale.errors import DlscaleError, InvalidField, NotFound, redact_paths
from dlscale.frontends.access import Access
from dlscale.frontends.plane import Asked
from dlscale.frontends.rest.openai.decode import (
    Call,
    chat_call,
    completion_call,
    detokenize_call,
    document,
    request_id,
    tokenize_call,
)
from dlscale.frontends.rest.openai.embeddings import (
    embedding_call,
    embeddings_document,
    encoder_inputs,
    encoder_request,
)
from dlscale.frontends.rest.openai.encode import Answer, Choice, Piece
from dlscale.frontends.rest.openai.errors import error_document, status_and_document
from dlscale.frontends.rest.openai.generation import (
    ModelError,
    close_all,
    events,
    firsts,
    merged,
)
from dlscale.frontends.rest.responses import (
    EVENT_STREAM,
    Decoder,
    Handler,
    RestResponse,
    path_parts,
)
from dlscale.serving.observe.logs import log_failure
from dlscale.serving.streams import aclose
from dlscale.types import ModelKind
from dlscale.wire.tensors import Buffer

log = logging.getLogger("dlscale.http")

#: The API group of every OpenAI route, for `--http-restricted-api openai:KEY=VALUE`.
GROUP = "openai"
#: vLLM's routes at the root of its API port, served here too (docs/openai.md).
ROOT_PATHS = ("/health", "/version", "/tokenize", "/detokenize")
#: The backends that tokenize without generating (the generative engines and the LoRA
#: adapters served on them; a Python model generates whatever it is asked).
TOKENIZERS = ("transformers", "vllm", "lora")


class OpenAIApi:
    """The `/v1/...` routes over a Plane."""

    def __init__(self, plane: Asked, access: Access, decoded: Decoder) -> None:
        self.plane = plane
        self.access = access
        self.decoded = decoded

    @staticmethod
    def serves(path: str) -> bool:
        """Whether `path` is this API's: under `/v1/`, or one of vLLM's at the root."""
        if path.startswith("/v2/"):  # OIP's, asked twice per inference: no split of the path
            return False
        return path.startswith("/v1/") or path.split("?", 1)[0] in ROOT_PATHS

    async def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """Answer one request of this API (`serves`); `headers` has lower-case names."""
        try:
            handler, args, allowed = self._route(path)
            if handler is None:
                return _error(404, f"no OpenAI route for {path[:200]!r}")
            self.access.check(_group(path), headers)
            if method != allowed:
                message = f"{method} is not allowed here; use {allowed}"
                return _error(405, message, (("allow", allowed),))
            return await handler(args, headers, self.decoded(headers, body))
        except ModelError as wrapped:
            return _failure(f"{method} {path}", wrapped.cause, wrapped.model)
        except DlscaleError as exc:
            return _failure(f"{method} {path}", exc)
        except Exception as exc:  # a bug must answer 500, not drop the connection
            log.exception("%s %s failed", method, path)
            return _error(500, redact_paths(f"internal error: {exc!r}"))

    def refusal_before_body(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> RestResponse | None:
        """The 401 of a caller without the key, in OpenAI's shape, before its body is read."""
        if self._route(path)[0] is None:
            return None  # `handle` answers 404
        try:
            self.access.check(_group(path), headers)
        except DlscaleError as exc:
            return _failure(f"{method} {path}", exc)
        return None

    def _route(self, path: str) -> tuple[Handler | None, list[str], str]:
        parts = path_parts(path)
        match parts:
            case ["health"]:
                return self._health, [], "GET"
            case ["version"]:
                return self._version, [], "GET"
            case ["tokenize"]:
                return self._tokenize, [], "POST"
            case ["detokenize"]:
                return self._detokenize, [], "POST"
        if parts[:1] != ["v1"]:
            return None, [], ""
        match parts[1:]:
            case ["models"]:
                return self._models, [], "GET"
            case ["models", model]:
                return self._model, [model], "GET"
            case ["completions"]:
                return self._generate, ["text"], "POST"
            case ["chat", "completions"]:
                return self._generate, ["chat"], "POST"
            case ["embeddings"]:
                return self._embeddings, [], "POST"
        return None, [], ""

    # -- vLLM's routes at the root -----------------------------------------------------------------

    async def _health(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """vLLM's `/health`: 200 with no body while the server can serve, else 503."""
        if await self.plane.ready():
            return RestResponse(200, [])
        reason = await self.plane.not_ready_reason()
        return _error(503, f"the server is not ready: {reason}")

    async def _version(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """vLLM's `/version`: `{"version": ...}`, the server's (dlscale's) version."""
        metadata = await self.plane.server_metadata()
        return RestResponse(200, [orjson.dumps({"version": metadata.version})])

    async def _tokenize(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """vLLM's `/tokenize`: the prompt's token ids, their count and the model's context."""
        call = tokenize_call(body, headers)
        ids = orjson.loads(await self._converted(call))
        doc: dict[str, Any] = {"count": len(ids), "tokens": ids}
        card = await self._card(call.model)
        if card is not None and "max_model_len" in card:
            doc["max_model_len"] = card["max_model_len"]
        return RestResponse(200, [orjson.dumps(doc)])

    async def _detokenize(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """vLLM's `/detokenize`: the text of token ids."""
        text = await self._converted(detokenize_call(body, headers))
        return RestResponse(200, [orjson.dumps({"prompt": text})])

    async def _converted(self, call: Call) -> str:
        """The text of a tokenize or detokenize request's one answer (no generation step)."""
        try:
            config = await self.plane.model_config(call.model)
            if config.backend not in TOKENIZERS:
                raise InvalidField(
                    "model",
                    f"model {call.model!r} ({config.backend}) does not tokenize; the "
                    f"{' and '.join(TOKENIZERS)} engines do",
                )
            responses = self.plane.stream(call.request)
            try:
                texts = [Piece.of(r).text async for r in responses]
            finally:
                await aclose(responses)
        except DlscaleError as exc:
            raise ModelError(call.model, exc) from None
        return "".join(texts)

    # -- models ------------------------------------------------------------------------------------

    async def _models(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        names = {e.name for e in await self.plane.repository_index(True)}
        cards = [await self._card(name) for name in sorted(names)]
        doc = {"object": "list", "data": [c for c in cards if c is not None]}
        return RestResponse(200, [orjson.dumps(doc)])

    async def _model(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        card = await self._card(args[0])
        if card is None:
            raise ModelError(args[0], NotFound(f"model {args[0]!r} is not generative"))
        return RestResponse(200, [orjson.dumps(card)])

    async def _card(self, name: str) -> dict[str, Any] | None:
        """A generative model's `model` object (with max_model_len when its config says it),
        None for any other model or one that went away meanwhile."""
        try:
            metadata = await self.plane.model_metadata(name)
            if metadata.kind is not ModelKind.GENERATIVE:
                return None
            parameters = (await self.plane.model_config(name)).parameters
        except DlscaleError:
            return None
        card: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "dlscale",
        }
        # [metadata] max_model_len, as vLLM names it, or the zoo's `context`.
        length = parameters.get("max_model_len") or parameters.get("context", "")
        if length.isdigit():
            card["max_model_len"] = int(length)
        if parameters.get("base"):  # a LoRA adapter: its base model, as vLLM reports it
            card["parent"] = parameters["base"]
        return card

    # -- embeddings --------------------------------------------------------------------------------

    async def _embeddings(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """One batch through the encoder's own queue; its vectors in OpenAI's list."""
        call = embedding_call(document(body))
        try:
            ids = encoder_inputs(await self.plane.model_metadata(call.model))
            if ids is None:
                raise InvalidField(
                    "model",
                    f"model {call.model!r} is no embedding model (inputs input_ids and "
                    "attention_mask, output pooler_output or last_hidden_state)",
                )
            response = await self.plane.infer(encoder_request(call, ids, request_id(headers)))
        except DlscaleError as exc:
            raise ModelError(call.model, exc) from None
        return RestResponse(200, [orjson.dumps(embeddings_document(call, response))])

    # -- generation --------------------------------------------------------------------------------

    async def _generate(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """A completion (`args` ["text"]) or a chat: one generation per prompt, the whole answer
        or its chunks once every prompt's first response is in."""
        chat = args == ["chat"]
        call = chat_call(body, headers) if chat else completion_call(body, headers)
        choices = [Choice() for _ in call.requests]
        reply = Answer(
            call.request.id,
            call.model,
            chat,
            choices=choices,
            logprobs=call.logprobs,
            tools=call.tools,
        )
        streams = [self.plane.stream(request) for request in call.requests]
        try:
            first = await firsts(call.model, streams)
        except BaseException:
            await close_all(streams)  # the client left, a refusal, or a bug: all are freed
            raise
        if call.stream:
            chunks = events(reply, first, streams, call.include_usage)
            return RestResponse(200, [], EVENT_STREAM, stream=chunks)
        pieces = merged(first, streams)
        try:
            async for index, piece in pieces:
                reply.add(piece, index)
        except DlscaleError as exc:
            raise ModelError(call.model, exc) from None
        finally:
            await aclose(pieces)
            await close_all(streams)
        return RestResponse(200, [orjson.dumps(reply.whole())])


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> RestResponse:
    return RestResponse(status, [orjson.dumps(error_document(status, message))], headers=headers)


def _failure(what: str, exc: DlscaleError, model: str = "") -> RestResponse:
    """The answer to a request that failed with `exc`, logged as every failed request is."""
    log_failure("HTTP", model, exc.http_status, exc.reason, f"{what}: {exc}")
    status, doc = status_and_document(exc, model)
    return RestResponse(status, [orjson.dumps(doc)])


def _group(path: str) -> str:
    """The API group that guards `path`: vLLM's `/health` is health's (open to probes, as
    `/v2/health/*` are, whatever `--api-key` says); every other route is the OpenAI API's."""
    return "health" if path.split("?", 1)[0] == "/health" else GROUP
