"""A streaming client for generative endpoints: many concurrent streams, each chunk timestamped.

One aiohttp session with a pooled keep-alive connector carries every stream of a run. Each
request's server-sent events are read line by line as they arrive and stamped with
`perf_counter_ns` (a monotonic clock shared with LoadGen's callbacks). Sizes are bounded: an
event line over `MAX_EVENT_BYTES`, or a stream over `MAX_STREAM_BYTES`, ends the request as an
error rather than growing without limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from dlscale.bench.generative.endpoints import Ask, Endpoint, Event, read_event, request_body
from dlscale.bench.generative.records import Chunk, StreamRecord
from dlscale.bench.generative.tokens import TokenCounter

MAX_EVENT_BYTES = 1 << 20
MAX_STREAM_BYTES = 64 << 20
#: An error body is read up to this many bytes for its message.
MAX_ERROR_BYTES = 4096


class StreamClient:
    """Streams requests to one endpoint of one server; use as `async with`."""

    def __init__(
        self,
        url: str,
        kind: Endpoint,
        model: str,
        *,
        connections: int = 4096,
        counter: TokenCounter | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base = url.rstrip("/")
        #: OpenAI's bearer key, sent with every request (a server started with --api-key).
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.kind = kind
        self.model = model
        self.counter = counter
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        connector = aiohttp.TCPConnector(limit=self._connections, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=600.0),
            read_bufsize=MAX_EVENT_BYTES,
            headers=self._headers,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def stream(
        self,
        ask: Ask,
        *,
        scheduled_s: float | None = None,
        on_first: Callable[[StreamRecord], None] | None = None,
    ) -> StreamRecord:
        """Send one request and read its stream to the end; failures land in `error`."""
        if self._session is None:
            raise RuntimeError("StreamClient is used outside `async with`")
        body = request_body(self.kind, self.model, ask)
        record = StreamRecord(sent_ns=time.perf_counter_ns(), scheduled_s=scheduled_s)
        record.requested_tokens = ask.max_tokens
        try:
            async with self._session.post(self.base + self.kind.path(self.model), json=body) as r:
                if r.status != 200:
                    text = (await r.content.read(MAX_ERROR_BYTES)).decode(errors="replace")
                    record.error = f"HTTP {r.status}: {text.strip()[:300]}{self._hint(r.status)}"
                else:
                    await self._read(r, record, on_first)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.done_ns = record.done_ns or time.perf_counter_ns()
        if record.ok and not record.error:
            self._count(record)
        elif record.error is None:
            record.error = "the stream ended without output text"
        return record

    def _hint(self, status: int) -> str:
        """What to do about a 401: pass the key, or check the one passed."""
        if status != 401:
            return ""
        if self._headers:
            return " (the key given with --api-key or $OPENAI_API_KEY was refused)"
        return " (the server wants an API key: pass --api-key KEY, or set OPENAI_API_KEY)"

    async def _read(
        self,
        response: aiohttp.ClientResponse,
        record: StreamRecord,
        on_first: Callable[[StreamRecord], None] | None,
    ) -> None:
        received = 0
        data: list[str] = []
        while True:
            line = await response.content.readline()
            now = time.perf_counter_ns()
            received += len(line)
            if received > MAX_STREAM_BYTES:
                record.error = f"the stream passed {MAX_STREAM_BYTES} bytes"
                return
            if not line:  # end of the stream (OIP generate_stream sends no [DONE])
                if data:
                    self._take(read_event(self.kind, "\n".join(data)), now, record, on_first)
                record.done_ns = now
                return
            text = line.decode(errors="replace").rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].removeprefix(" "))
                continue
            if text or not data:  # comments, other fields, keep-alive blank lines
                continue
            event = read_event(self.kind, "\n".join(data))
            data = []
            if self._take(event, now, record, on_first):
                record.done_ns = now
                return

    @staticmethod
    def _take(
        event: Event,
        now: int,
        record: StreamRecord,
        on_first: Callable[[StreamRecord], None] | None,
    ) -> bool:
        """Apply one event to the record; True when the stream is over ([DONE] or an error)."""
        if event.error is not None:
            record.error = event.error
            return True
        if event.text:
            record.chunks.append(Chunk(now, event.text))
            if len(record.chunks) == 1 and on_first is not None:
                on_first(record)
        if event.tokens is not None:
            record.server_tokens = event.tokens
        if event.prompt_tokens is not None:
            record.server_prompt_tokens = event.prompt_tokens
        record.finish_reason = event.finish_reason or record.finish_reason
        return event.done

    def _count(self, record: StreamRecord) -> None:
        """Where the output token count comes from: the server, the tokenizer, or chunks."""
        if record.server_tokens is not None:
            record.token_source = "server"
        elif self.counter is not None:
            record.counted_tokens = self.counter.count(record.text)
            record.token_source = "tokenizer"
        else:
            record.token_source = "chunks"
