"""A local inference engine that speaks the part of SGLang's HTTP API the rollout uses.

POST /generate {input_ids, sampling_params: {temperature, top_p, max_new_tokens, stop,
stop_token_ids}, return_logprob} -> {text, meta_info: {output_token_logprobs: [[logprob, id,
None]], finish_reason: {type: stop | length}}}; GET /health. Concurrent requests are batched:
they wait a few milliseconds for company, then decode together with a KV cache (left-padded),
one forward pass per step for the whole batch. Log-probs are those of the model's own
distribution (log-softmax of the logits), so a trainer's forward pass of the same weights
gives the same numbers. `load_state_dict` swaps weights between steps (the trainer's sync).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deepdive.grpo import scoring_temperature


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
    finish_reason: str = "length"


class LocalEngine:
    def __init__(
        self, model: Any, tokenizer: Any, max_batch: int = 32, batch_window_s: float = 0.005
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()  # weights never change in the middle of a batch
        self._queue: (
            asyncio.Queue[tuple[GenerationRequest, asyncio.Future[GenerationResult]]] | None
        ) = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.model.load_state_dict(state)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:  # one batching worker per event loop
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = asyncio.ensure_future(self._serve_batches())
        future: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        await self._queue.put((request, future))
        return await future

    async def _serve_batches(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.batch_window_s)
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            self.batch_sizes.append(len(batch))
            try:
                results = await anyio.to_thread.run_sync(self.generate_batch, [r for r, _ in batch])
            except Exception as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Decode every request to its own stop or length, together."""
        import torch

        with self._lock, torch.no_grad():
            model, device = self.model, next(self.model.parameters()).device
            width = max(len(r.input_ids) for r in requests)
            pad = self.tokenizer.pad_token_id or 0
            ids = torch.tensor(
                [[pad] * (width - len(r.input_ids)) + r.input_ids for r in requests], device=device
            )
            mask = torch.tensor(
                [[0] * (width - len(r.input_ids)) + [1] * len(r.input_ids) for r in requests],
                device=device,
            )
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            generators = [
                torch.Generator(device=device).manual_seed(r.seed) if r.seed is not None else None
                for r in requests
            ]
            results = [GenerationResult() for _ in requests]
            active = [r.max_new_tokens > 0 for r in requests]
            eos = {self.tokenizer.eos_token_id}
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            past, logits = out.cache, out.logits[:, -1, :].float()
            # SGLang's default: the log-probs of the distribution each token was sampled from,
            # softmax(logits / temperature); greedy rows report the plain softmax
            scale = torch.tensor(
                [[scoring_temperature(r.temperature)] for r in requests], device=device
            )
            while any(active):
                logprobs = torch.log_softmax(logits / scale, dim=-1)
                next_ids = []
                for row, request in enumerate(requests):
                    if not active[row]:
                        next_ids.append(pad)
                        continue
                    token = _sample(logits[row], request, generators[row])
                    result = results[row]
                    result.ids.append(token)
                    result.logprobs.append(float(logprobs[row, token]))
                    next_ids.append(token)
                    stops = eos | set(request.stop_token_ids)
                    if token in stops:
                        result.finish_reason, active[row] = "stop", False
                    elif request.stop:
                        text = self.tokenizer.decode(result.ids, skip_special_tokens=False)
                        if any(s in text for s in request.stop):
                            result.finish_reason, active[row] = "stop", False
                    if active[row] and len(result.ids) >= request.max_new_tokens:
                        result.finish_reason, active[row] = "length", False
                if not any(active):
                    break
                mask = torch.cat(
                    [mask, torch.ones((len(requests), 1), dtype=mask.dtype, device=device)], dim=-1
                )
                positions = positions[:, -1:] + 1
                out = model(
                    input_ids=torch.tensor([next_ids], device=device).T,
                    attention_mask=mask,
                    position_ids=positions,
                    cache=past,
                    use_cache=True,
                )
                past, logits = out.cache, out.logits[:, -1, :].float()
            for result in results:
                result.text = self.tokenizer.decode(result.ids, skip_special_tokens=False)
            return results


def _sample(logits: Any, request: GenerationRequest, generator: Any) -> int:
    import torch

    if request.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < request.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def parse_request(body: Any) -> GenerationRequest:
    """SGLang's /generate body, checked; ValueError names what is wrong."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("input_ids"), list)
        or not body["input_ids"]
    ):
        raise ValueError("input_ids: expected a non-empty list of token ids")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in body["input_ids"]):
        raise ValueError("input_ids: expected integers")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ValueError("sampling_params: expected an object")
    stop = params.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    return GenerationRequest(
        input_ids=list(body["input_ids"]),
        max_new_tokens=int(params.get("max_new_tokens", 128)),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        stop=tuple(str(s) for s in stop),
        stop_token_ids=tuple(int(i) for i in params.get("stop_token_ids") or []),
        seed=params.get("sampling_seed"),
    )


def create_engine_app(engine: LocalEngine) -> Starlette:
    async def generate(request: Request) -> Response:
        try:
            parsed = parse_request(orjson.loads(await request.body()))
        except (ValueError, TypeError, orjson.JSONDecodeError) as error:
            return Response(
                orjson.dumps({"error": {"message": str(error)}}),
                status_code=400,
                media_type="application/json",
            )
        result = await engine.generate(parsed)
        pairs = [[lp, token, None] for lp, token in zip(result.logprobs, result.ids, strict=True)]
        meta = {
            "finish_reason": {"type": result.finish_reason},
            "output_token_logprobs": pairs,
            "prompt_tokens": len(parsed.input_ids),
            "completion_tokens": len(result.ids),
        }
        return Response(
            orjson.dumps({"text": result.text, "meta_info": meta}), media_type="application/json"
        )

    async def health(_: Request) -> Response:
        return Response(b'{"status": "ok"}', media_type="application/json")

    return Starlette(
        routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)]
    )
