"""transformers' continuous-batching manager on one model, its outputs routed to each request.

The manager runs its own generation thread (iteration-level batching over a paged KV cache)
and puts every request's outputs on one queue. A router thread of ours takes them off and
hands each to the callback its request registered (the backend's stream turns it into an
event-loop wake-up), so neither the generation thread nor the event loop ever waits on the
other. Settings come from the config's [backend_options] (docs/generative.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    ContinuousBatchingConfig,
    GenerationConfig,
)
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from dlscale.backends.base import FailureReport
from dlscale.backends.generative.contract import EngineStats, StepGate
from dlscale.backends.generative.lora_files import lora_off
from dlscale.backends.generative.lora_layers import BASE, Adapters
from dlscale.backends.generative.transformers_sampling import RequestSampling
from dlscale.backends.generative.transformers_settings import DTYPES, EngineSettings
from dlscale.errors import BackendError, ConfigError, DlscaleError, Unavailable

if TYPE_CHECKING:
    from dlscale.backends.generative.transformers_grammar import Grammars

#: What a request's callback receives: each output of its sequence, or the engine's failure.
Sink = Callable[[GenerationOutput | DlscaleError], None]


def _cached_share(cache: Any) -> float:
    """The share of the paged cache in blocks that no sequence holds but that are kept for a
    later prefix match. transformers' free capacity leaves them out (they are not in the pool
    until evicted), so an idle engine after a run of long prompts read as 0.63 used (issue 37)."""
    total = cache.num_sectors * cache.bytes_per_sector
    kept = sum(
        len(a.ledger.cached_blocks) * a.bytes_per_block for a in cache.cache_allocators.values()
    )
    return kept / total if total else 0.0


class _PrefixLookups:
    """Prompt tokens looked up in the prefix cache and those found, as vLLM counts them
    (prefix_cache_queries and _hits): transformers counts neither, so the cache's lookup, which
    its scheduler calls once per new sequence, is wrapped where the cache is first seen."""

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        self._cache: Any = None

    @property
    def reported(self) -> bool:
        """Whether the engine shares prefixes (not with adapters) and has a cache yet."""
        return self._cache is not None

    def watch(self, cache: Any) -> None:
        if cache is self._cache or not getattr(cache, "use_prefix_sharing", False):
            return
        self._cache = cache
        search = cache.search_prefix_match

        def counted(request_id: str, prompt_ids: list[int]) -> int:
            found = int(search(request_id, prompt_ids))
            self.queries += len(prompt_ids)  # one thread (the generation loop's) adds
            self.hits += found
            return found

        cache.search_prefix_match = counted


class _Manager(ContinuousBatchingManager):
    """transformers' manager with each request's own sampling, computing with our threads."""

    def __init__(self, model: Any, generation: Any, cache: Any, threads: int) -> None:
        super().__init__(model, generation, cache)
        # Read by the batch processor that start() builds (instead of the config's processors).
        self.logit_processor = RequestSampling()
        self._threads = threads
        #: What ended the generation thread when transformers did not catch it itself (an
        #: unsupported release's TypeError at start): None while it runs or after a stop.
        self.crash: BaseException | None = None
        #: Paces each step by the device's scheduler (set once by the backend's `pace`);
        #: None: free. The generation thread reads it at each step.
        self.gate: StepGate | None = None
        self.lookups = _PrefixLookups()

    def _generation_step(self) -> None:
        # One step is the engine's unit of device work, as a batch is a classic model's: with
        # the step inside the gate, a classic model's batch on the same device waits for at
        # most one step, and the scheduler counts the engine's device time step by step.
        gate = self.gate
        if gate is None:
            super()._generation_step()
            return
        processor = self.batch_processor
        rows = getattr(getattr(processor, "inputs_and_outputs", None), "num_request_in_batch", 1)
        with gate.step(max(1, int(rows))):
            super()._generation_step()

    def _run_generation_loop(self, use_inference_mode: bool) -> None:
        try:
            # Under OpenMP the thread count belongs to each OS thread, and a new one starts
            # with one per core whatever the loading thread set: on a shared machine, threads
            # waiting at a barrier for a descheduled peer slow each step many times over.
            if self._threads > 0:
                torch.set_num_threads(self._threads)
            super()._run_generation_loop(use_inference_mode)
        except BaseException as exc:  # the thread ends: the router reads why and says so
            self.crash = exc
            raise
        finally:
            if self.gate is not None:
                self.gate.rest()

    def _generation_loop_body(self, batch_processor: Any, bootstrapping: bool) -> bool:
        self.lookups.watch(batch_processor.cache)
        going = bool(super()._generation_loop_body(batch_processor, bootstrapping))
        # Its last sequences ended (or left): the device's slot goes back now, not when a next
        # step asks for it (a failure ends the loop, whose `finally` gives it back).
        if self.gate is not None and not batch_processor.has_pending_requests():
            self.gate.rest()
        return going

    def failure(self) -> str:
        """Why the generation thread ended, in words ("" when nothing failed)."""
        fatal = self.crash or self.background_thread_status.fatal_error
        return "" if fatal is None else f"{type(fatal).__name__}: {fatal}"


def _context(positions: int, max_model_len: int | None) -> int:
    """The tokens a sequence may hold: max_model_len, at most the model's positions."""
    if max_model_len is None:
        return positions
    if max_model_len > positions:
        raise ConfigError(
            f"transformers backend: max_model_len {max_model_len} is above the model's "
            f"max_position_embeddings ({positions})"
        )
    return max_model_len


def _cache_tokens(manager: Any, page_size: int, context: int) -> int:
    """The tokens the paged cache holds, as warmup sized it (the context when unknown)."""
    processor = manager.batch_processor
    blocks = getattr(getattr(processor, "cache", None), "num_blocks", None)
    return int(blocks) * page_size if isinstance(blocks, int) else context


def _grammars(tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> Grammars | None:
    """The model's grammar compiler, None where xgrammar (the [llm] extra's) is missing."""
    try:
        from dlscale.backends.generative.transformers_grammar import Grammars
    except ImportError:
        return None
    return Grammars(tokenizer, vocab_size, eos_ids)


class Engine:
    """One model, its tokenizer and a running continuous-batching manager."""

    def __init__(
        self, folder: Path, settings: EngineSettings, on_failure: FailureReport | None = None
    ) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if settings.chat_template is not None:
            self.tokenizer.chat_template = settings.chat_template.read_text()
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, dtype=DTYPES[settings.dtype], attn_implementation=settings.attn_implementation
        )
        self.model = model.to(settings.device).eval()
        config = self.model.config
        self.vocabulary: int = int(config.vocab_size)
        self.context: int = _context(int(config.max_position_embeddings), settings.max_model_len)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids: tuple[int, ...] = tuple(eos if isinstance(eos, list) else [eos])
        self.grammars = _grammars(self.tokenizer, int(config.vocab_size), self.eos_ids)
        #: The LoRA adapters it serves (None: enable_lora is off); each sequence's slot.
        self.adapters: Adapters | None = None
        self._slots: dict[str, int] = {}
        if settings.enable_lora:
            self.adapters = Adapters(
                self.model,
                settings.max_loras,
                settings.max_lora_rank,
                settings.device,
                self.model.dtype,
            )
            self.model.register_forward_pre_hook(self._route_adapters, with_kwargs=True)
        # Greedy for every sequence: sampling is per request, by RequestSampling's processors.
        generation = GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=False, eos_token_id=list(self.eos_ids), pad_token_id=config.pad_token_id
        )
        self.manager = _Manager(
            self.model, generation, self._cache_config(settings), settings.threads
        )
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._on_failure = on_failure
        #: Why the engine can no longer serve ("" while it can): its thread died.
        self.failed = ""
        # The cache and the step's buffers are allocated here, so that a loaded model takes
        # its first request at once (start() would otherwise build them in its thread).
        self.manager.warmup()
        #: Tokens the KV cache holds: a sequence that needs more would stop the engine (its
        #: scheduler can neither place nor offload it), so it is refused first.
        self.cache_tokens: int = _cache_tokens(self.manager, settings.page_size, self.context)
        self.manager.start()
        self._router = threading.Thread(target=self._route, name="dlscale-hf-router", daemon=True)
        self._router.start()

    def _cache_config(self, settings: EngineSettings) -> Any:
        config = self.model.config
        num_blocks = None
        if settings.kv_cache_gib is not None:
            head_dim = getattr(config, "head_dim", None) or (
                config.hidden_size // config.num_attention_heads
            )
            kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            per_token = (
                2 * config.num_hidden_layers * kv_heads * head_dim * self.model.dtype.itemsize
            )
            num_blocks = max(
                1, int(settings.kv_cache_gib * 2**30) // (per_token * settings.page_size)
            )
        return ContinuousBatchingConfig(
            page_size=settings.page_size,
            num_blocks=num_blocks,
            max_batch_tokens=settings.max_batch_tokens,
            max_requests_per_batch=settings.max_num_seqs,
            max_memory_percent=settings.gpu_memory_fraction,
            # transformers keys a shared prefix's cache blocks by its tokens alone: with
            # adapters, one adapter's keys and values would answer another's prompt.
            allow_block_sharing=not settings.enable_lora,
            # The row processors (transformers_rows.py) read each request's Python state at
            # every step: a CUDA graph would replay the first step's, and double buffering
            # would run a step before the last one's tokens are in that state.
            use_cuda_graph=False,
            use_async_batching=False,
        )

    def submit(
        self,
        engine_id: str,
        prompt: list[int],
        max_tokens: int,
        eos: list[int],
        sampling: Mapping[str, Any],
        sink: Sink,
        adapter: str = "",
    ) -> None:
        """Queue one sequence (of `adapter`, "" for the base model); `sink` gets its outputs
        from the router thread."""
        slot = self.adapters_for(adapter).slot(adapter) if adapter else BASE
        with self._lock:
            if self.failed:
                raise Unavailable(f"the transformers engine died: {self.failed}")
            if self._closed.is_set():
                raise Unavailable("the transformers engine is stopped")
            self._sinks[engine_id] = sink
            if slot != BASE:
                self._slots[engine_id] = slot
        queued = self.manager.add_request(
            prompt,
            request_id=engine_id,
            max_new_tokens=max_tokens,
            streaming=True,
            eos_token_id=eos or [-1],
            **sampling,
        )
        if queued is None:  # the manager is stopping or failed: it drops the request
            with self._lock:
                self._sinks.pop(engine_id, None)
                self._slots.pop(engine_id, None)
            raise Unavailable("the transformers engine takes no new sequences (it stopped)")

    def cancel(self, engine_id: str) -> None:
        """Drop a sequence: its KV-cache blocks are freed at the engine's next step."""
        with self._lock:
            known = self._sinks.pop(engine_id, None) is not None
        if known:
            self.manager.cancel_request(engine_id)
        # The engine drops a cancelled sequence before it schedules its next step.
        with self._lock:
            self._slots.pop(engine_id, None)

    def adapters_for(self, name: str) -> Adapters:
        """The engine's adapters, which adapter `name` needs (ConfigError without LoRA)."""
        if self.adapters is None:
            raise lora_off(name)
        return self.adapters

    def _route_adapters(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each forward pass: which tokens of the step each adapter computes."""
        adapters = self.adapters
        processor = self.manager.batch_processor
        if adapters is None:
            return
        if processor is None or not self._slots:
            adapters.route((), (), 0)
            return
        # Synchronous batching (use_async_batching is off): the step's one set of inputs.
        requests = getattr(processor.inputs_and_outputs, "requests_in_batch", ())
        adapters.route(
            [self._slots.get(r.state.request_id, BASE) for r in requests],
            [r.query_length for r in requests],
            int(kwargs["input_ids"].shape[-1]),
        )

    def stats(self) -> EngineStats:
        """Running and waiting sequences and the share of the KV cache in use, read as they are."""
        processor = self.manager.batch_processor
        queued = self.manager.input_queue.qsize()
        if processor is None:
            return EngineStats(running=0, waiting=queued, kv_cache_usage=0.0)
        scheduler = processor.scheduler
        free = float(processor.cache.compute_free_capacity())
        cached = _cached_share(processor.cache)
        lookups = self.manager.lookups
        return EngineStats(
            running=len(scheduler.active_requests),
            waiting=len(scheduler.waiting_requests) + queued,
            kv_cache_usage=max(0.0, 1.0 - free - cached),
            kv_cache_cached=cached,
            prefix_cache_queries=lookups.queries if lookups.reported else None,
            prefix_cache_hits=lookups.hits if lookups.reported else None,
        )

    def _route(self) -> None:
        while not self._closed.is_set():
            output = self.manager.get_result(timeout=0.1)
            if output is None:
                if not self.manager.is_running():
                    break
                continue
            with self._lock:
                sink = self._sinks.get(output.request_id)
                if sink is not None and output.is_finished():
                    del self._sinks[output.request_id]
                    self._slots.pop(output.request_id, None)
            if sink is not None:
                sink(self._death(output) or output)
        self._ended()

    def _death(self, output: GenerationOutput) -> Unavailable | None:
        """A failed sequence's error when the engine is dying (None otherwise): transformers
        asks its loop for a hard stop, then fails every sequence it holds with the cause (and
        only then records it), which is the engine's and not the request's, so it reaches the
        client as UNAVAILABLE naming the cause. A stop we asked for (close) is no death."""
        if output.status != RequestStatus.FAILED or self._closed.is_set():
            return None
        status = self.manager.background_thread_status
        if status.fatal_error is None and status.local_status < status.HARD_STOP:
            return None  # this sequence's own failure: the engine goes on
        return Unavailable(f"the transformers engine died: {output.error or 'it stopped'}")

    def _ended(self) -> None:
        """The generation thread ended: no sequence left will finish. Unless we stopped it,
        the engine died: it refuses what comes, and says so to whoever loaded it."""
        died = not self._closed.is_set()
        reason = (self.manager.failure() or "its generation thread ended") if died else ""
        with self._lock:
            self.failed = reason
            left, self._sinks = list(self._sinks.values()), {}
        error: DlscaleError = (
            Unavailable(f"the transformers engine died: {reason}")
            if died
            else BackendError("the transformers engine stopped before the sequence ended")
        )
        for sink in left:
            sink(error)
        if died and self._on_failure is not None:
            self._on_failure(f"the transformers engine died: {reason}")

    def close(self) -> None:
        """Stop the engine at once (sequences still running end with an error) and free it."""
        self._closed.set()
        self.manager.stop(block=True, timeout=30, hard_stop=True)
        self._router.join(timeout=5)
        # The manager's stop already collected garbage and emptied the device's cache; what is
        # left of the weights goes with the last references.
        del self.manager, self.model
