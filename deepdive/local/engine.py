"""A local inference engine that speaks the part of SGLang's HTTP API the rollout uses.

POST /generate {input_ids, sampling_params: {temperature, top_p, max_new_tokens, stop,
stop_token_ids, sampling_seed}, return_logprob} -> {text, meta_info: {output_token_logprobs:
[[logprob, id, None]], finish_reason: {type: stop | length}}}; GET /health, /ready, /metrics.
It is served like every other service (`services.web.service_app`): bearer auth on all but
/health when a token is set, malformed input a 4xx naming the field, no tracebacks.

Concurrent requests are batched: they wait a few milliseconds for company, then decode together
with a KV cache (left-padded), one forward pass per step for the rows still decoding
(deepdive.local.decoder). A finished row's cache is kept, and a request that extends it (the
episode's next turn) computes only its new tokens (deepdive.local.prefix_store). A request is
checked before it joins a batch, so one client's bad token id or seed never fails the others.
The reported log-probs are those of the distribution each token was sampled from,
log softmax(logits / temperature) (SGLang's default; plain log softmax for greedy rows), so a
trainer scoring the same weights at the same temperature gets the same numbers.
`load_state_dict` swaps weights between steps (the trainer's sync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from deepdive.local.decoder import Decoder, DirectDecoder, TransformersDecoder, supports_direct
from deepdive.local.grpo import scoring_temperature
from deepdive.local.prefix_store import PrefixStore
from deepdive.local.sampling import next_tokens
from deepdive.protocol import MISSING, json_kind
from services.base.errors import RequestError
from services.base.logs import log_event
from services.serving.metrics import ServiceMetrics
from services.web import json_response, read_json_body, request_error, service_app

logger = logging.getLogger("deepdive.local.engine")

MAX_BODY_BYTES = 16 * 1024 * 1024  # a 100k-token prompt is ~0.7 MB of JSON


# Requests decoded together at most (`deepdive serve engine --max-batch`).
DEFAULT_MAX_BATCH = 32


@dataclass
class GenerationRequest:
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class GenerationResult:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # stop | length, once done


class LocalEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch: int = DEFAULT_MAX_BATCH,
        batch_window_s: float = 0.005,
        prefix_cache_mb: int = 256,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.batch_sizes: list[int] = []
        # the Qwen2 family decodes through its own layers, with a prefix cache across turns
        self.direct = supports_direct(model)
        self.prefix_store = PrefixStore(prefix_cache_mb * 2**20)
        self._lock = threading.Lock()  # weights never change in the middle of a batch
        self._queue: (
            asyncio.Queue[tuple[GenerationRequest, asyncio.Future[GenerationResult]]] | None
        ) = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def vocab_size(self) -> int:
        """Token ids the model can embed: an id past it fails the forward pass of a whole batch."""
        embeddings = getattr(self.model, "get_input_embeddings", None)
        if callable(embeddings):
            return int(embeddings().num_embeddings)
        return len(self.tokenizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.model.load_state_dict(state)
            self.prefix_store.clear()  # computed by the old weights

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:  # one batching worker per event loop
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = None
        if self._worker is None or self._worker.done():  # never queue where nobody serves
            self._worker = asyncio.ensure_future(self._serve_batches())
        future: asyncio.Future[GenerationResult] = loop.create_future()
        await self._queue.put((request, future))
        return await future

    def not_ready_reasons(self) -> dict[str, str]:
        """Empty while a request would be served: the batching loop runs, or starts with the
        first request. A loop that ended is reported (the next request starts a new one)."""
        worker = self._worker
        if worker is None or not worker.done():
            return {}
        if worker.cancelled():
            return {"batching": "the batching loop was stopped"}
        error = worker.exception()
        why = type(error).__name__ if error is not None else "it returned"
        return {"batching": f"the batching loop stopped ({why})"}

    def ready_details(self) -> dict[str, Any]:
        return {
            "model": getattr(self.model, "name_or_path", "") or type(self.model).__name__,
            "max_batch": self.max_batch,
            "waiting": self._queue.qsize() if self._queue is not None else 0,
        }

    async def aclose(self) -> None:
        """Stop this event loop's batching worker (the server's shutdown); requests still
        queued fail rather than wait forever. Another loop may start serving afterwards."""
        worker, queue = self._worker, self._queue
        if self._loop is not asyncio.get_running_loop():
            return  # the worker, if any, belongs to another server's loop
        self._loop, self._queue, self._worker = None, None, None
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        while queue is not None and not queue.empty():
            _, future = queue.get_nowait()
            if not future.done():
                future.set_exception(RuntimeError("the engine shut down"))

    async def _serve_batches(self) -> None:
        assert self._queue is not None
        queue = self._queue
        batch: list[tuple[GenerationRequest, asyncio.Future[GenerationResult]]] = []
        try:
            while True:
                batch = [await queue.get()]
                await asyncio.sleep(self.batch_window_s)
                while not queue.empty() and len(batch) < self.max_batch:
                    batch.append(queue.get_nowait())
                self.batch_sizes.append(len(batch))
                try:
                    results = await anyio.to_thread.run_sync(
                        self.generate_batch, [r for r, _ in batch]
                    )
                    if len(results) != len(batch):
                        raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
                except Exception as error:  # this batch fails; the loop serves the next one
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():  # done: cancelled with its request
                        future.set_result(result)
        finally:  # stopped (the server's shutdown): nobody waits forever on a batch in flight
            for _, future in batch:
                if not future.done():
                    future.set_exception(RuntimeError("the engine's batching loop stopped"))

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Decode every request to its own stop or length, together. A row that is done leaves
        the batch, so the others decode without it: with the rows of a turn ending anywhere
        from 20 to 150 tokens, half of a batch's row-steps decoded rows already done. A done
        row's cache is kept for the request that extends it (the episode's next turn)."""
        import torch

        with self._lock, torch.no_grad():
            decoder = self._decoder(requests)
            device = decoder.logits.device
            generators = [
                torch.Generator(device=device).manual_seed(r.seed) if r.seed is not None else None
                for r in requests
            ]
            results = [GenerationResult() for _ in requests]
            eos = {self.tokenizer.eos_token_id}
            # SGLang's default: the log-probs of the distribution each token was sampled from,
            # softmax(logits / temperature); greedy rows report the plain softmax
            scale = torch.tensor(
                [[scoring_temperature(r.temperature)] for r in requests], device=device
            )
            rows = list(range(len(requests)))  # the request in each slot of the batch
            while True:
                logits = decoder.logits
                logprobs = torch.log_softmax(logits / scale, dim=-1)
                batch = [requests[row] for row in rows]
                tokens = next_tokens(
                    logprobs,
                    logits,
                    [r.temperature for r in batch],
                    [r.top_p for r in batch],
                    [generators[row] for row in rows],
                )
                picked = torch.tensor(tokens, device=device)[:, None]
                token_logprobs = logprobs.gather(1, picked)[:, 0].tolist()
                decoding, next_ids = [], []
                for slot, row in enumerate(rows):
                    request, result = requests[row], results[row]
                    if request.max_new_tokens > 0:
                        token = tokens[slot]
                        result.ids.append(token)
                        result.logprobs.append(token_logprobs[slot])
                        result.finish_reason = self._finish(request, result, token, eos)
                    else:
                        result.finish_reason = "length"
                    if result.finish_reason is None:
                        decoding.append(slot)
                        next_ids.append(result.ids[-1])
                    else:
                        self._keep_cache(decoder, slot, request.input_ids + result.ids[:-1])
                if not decoding:
                    break
                if len(decoding) < len(rows):  # the rows that are done leave the batch
                    decoder.keep(decoding)
                    scale = scale[torch.tensor(decoding, device=device)]
                    rows = [rows[slot] for slot in decoding]
                decoder.step(next_ids)
            for result in results:
                result.text = self.tokenizer.decode(result.ids, skip_special_tokens=False)
            return results

    def _decoder(self, requests: list[GenerationRequest]) -> Decoder:
        pad = self.tokenizer.pad_token_id or 0
        prompts = [r.input_ids for r in requests]
        if not self.direct:
            return TransformersDecoder(self.model, prompts, pad)
        cached = [self.prefix_store.take(p) for p in prompts]
        new_tokens = max(r.max_new_tokens for r in requests)
        return DirectDecoder(self.model, prompts, cached, new_tokens, pad)

    def _keep_cache(self, decoder: Decoder, slot: int, ids: list[int]) -> None:
        layers = decoder.row_cache(slot)
        if layers is not None:
            self.prefix_store.put(ids, layers)

    def _finish(
        self, request: GenerationRequest, result: GenerationResult, token: int, eos: set[int]
    ) -> str | None:
        """Why the row is done after `token`: stop or length; None while it decodes on."""
        if token in eos or token in request.stop_token_ids:
            return "stop"
        if request.stop:
            text = stop_window(self.tokenizer, result.ids, request.stop)
            if any(stop in text for stop in request.stop):
                return "stop"
        return "length" if len(result.ids) >= request.max_new_tokens else None


def stop_window(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> str:
    """The text of the last tokens, enough to hold any stop the newest token completes.
    Checked after every token, a stop first found in the whole text ends in the newest token;
    a stop of L characters is at most 4L bytes (UTF-8) and a token at least one byte, so the
    last 4L + 3 tokens hold it whole (the newest may end a character begun 3 bytes before it);
    8 instead of 3 is a margin. Decoding the whole text after every token made a long row's
    stop check quadratic."""
    reach = 4 * max(len(stop) for stop in stops) + 8
    text: str = tokenizer.decode(ids[-reach:], skip_special_tokens=False)
    return text


def parse_request(body: Any, vocab_size: int | None = None) -> GenerationRequest:
    """SGLang's /generate body, checked before it can join a batch; `RequestError` names the
    field. Unknown sampling parameters (SGLang has many) are ignored, as before."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {json_kind(body)}")
    ids = body.get("input_ids", MISSING)
    if not isinstance(ids, list) or not ids:
        raise RequestError(
            f"field 'input_ids': expected a non-empty list of token ids, got {json_kind(ids)}"
        )
    for i in ids:
        if not _is_int(i) or i < 0 or (vocab_size is not None and i >= vocab_size):
            bound = f" below {vocab_size}" if vocab_size is not None else ""
            raise RequestError(
                f"field 'input_ids': expected token ids from 0{bound}, got {_shown(i)}"
            )
    params = body.get("sampling_params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError(f"field 'sampling_params': expected an object, got {json_kind(params)}")
    max_new_tokens = params.get("max_new_tokens", 128)
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise RequestError(
            "field 'sampling_params.max_new_tokens': expected a non-negative integer, "
            f"got {_shown(max_new_tokens)}"
        )
    temperature = _number(params, "temperature", 1.0)
    if temperature < 0:
        raise RequestError(
            f"field 'sampling_params.temperature': expected 0 (greedy) or more, got {temperature}"
        )
    top_p = _number(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"field 'sampling_params.top_p': expected (0, 1], got {top_p}")
    stop = params.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(
            "field 'sampling_params.stop': expected a string or a list of strings, "
            f"got {json_kind(params.get('stop'))}"
        )
    stop_ids = params.get("stop_token_ids")
    stop_ids = [] if stop_ids is None else stop_ids
    if not isinstance(stop_ids, list) or not all(_is_int(i) for i in stop_ids):
        raise RequestError(
            "field 'sampling_params.stop_token_ids': expected a list of token ids, "
            f"got {json_kind(params.get('stop_token_ids'))}"
        )
    seed = params.get("sampling_seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**64):
        raise RequestError(
            "field 'sampling_params.sampling_seed': expected an integer from 0 below 2**64 or "
            f"null, got {_shown(seed)}"
        )
    return GenerationRequest(
        input_ids=list(ids),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=tuple(s for s in stop if s),  # an empty stop string would end every row at once
        stop_token_ids=tuple(stop_ids),
        seed=seed,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """An offending number as it was sent; any other value by its JSON type."""
    return str(value) if _is_int(value) else json_kind(value)


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(
            f"field 'sampling_params.{name}': expected a number, got {json_kind(value)}"
        )
    return float(value)


def create_engine_app(
    engine: LocalEngine,
    metrics: ServiceMetrics | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ASGIApp:
    """The engine as a service: POST /generate plus service_app's /health, /ready, /metrics,
    bearer auth on all but /health when `token` is set (the in-process local run sets none)."""
    metrics = metrics or ServiceMetrics("engine")

    async def generate(request: Request) -> Response:
        started = time.perf_counter()
        try:
            parsed = parse_request(await read_json_body(request, max_body_bytes), engine.vocab_size)
        except RequestError as error:
            metrics.observe_request("generate", error.code, time.perf_counter() - started)
            log_event(logger, "generate_refused", code=error.code, message=error.message)
            return request_error(error).response()
        try:
            result = await engine.generate(parsed)
        except Exception:
            # service_app's handler logs it and answers a generic 500; count it here
            metrics.observe_request("generate", "internal_error", time.perf_counter() - started)
            raise
        metrics.observe_request("generate", "ok", time.perf_counter() - started)
        pairs = [[lp, id_, None] for lp, id_ in zip(result.logprobs, result.ids, strict=True)]
        meta = {
            "finish_reason": {"type": result.finish_reason},
            "output_token_logprobs": pairs,
            "prompt_tokens": len(parsed.input_ids),
            "completion_tokens": len(result.ids),
        }
        return json_response({"text": result.text, "meta_info": meta})

    return service_app(
        [Route("/generate", generate, methods=["POST"])],
        metrics=metrics,
        not_ready=engine.not_ready_reasons,
        ready_details=engine.ready_details,
        on_shutdown=engine.aclose,
        token=token,
    )
