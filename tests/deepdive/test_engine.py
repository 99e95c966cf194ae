"""The local inference engine: SGLang's /generate contract, exact log-probs, stops, batching,
and the rollout driving it with a real tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from deepdive.clients import close_clients  # noqa: E402
from deepdive.generate import generate_with_tool  # noqa: E402
from deepdive.local.engine import (  # noqa: E402
    GenerationRequest,
    GenerationResult,
    LocalEngine,
    create_engine_app,
    stop_window,
)
from deepdive.local.model import new_model, train_tokenizer  # noqa: E402
from deepdive.offline.build import write_world  # noqa: E402
from deepdive.offline.world import WorldSizes  # noqa: E402
from deepdive.protocol import TOOL_CALL_CLOSE  # noqa: E402
from deepdive.rollout_settings import RolloutSettings, rollout_args  # noqa: E402
from deepdive.sample import LocalSample  # noqa: E402
from services.base.secrets import TOKEN_ENV  # noqa: E402
from services.serving.metrics import ServiceMetrics  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    out = tmp_path_factory.mktemp("world")
    write_world(out, seed=3, sizes=WorldSizes(12, 6, 4, 8, 20, 5, sft_questions=20))
    texts = [
        json.loads(line)["response"]
        for line in (out / "demonstrations.jsonl").read_text().splitlines()
    ]
    tokenizer = train_tokenizer(texts, vocab_size=600)
    return LocalEngine(new_model(tokenizer, seed=1), tokenizer, batch_window_s=0.02)


def prompt_ids(engine: LocalEngine, question: str = "Who made the silver lute?") -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
    return ids


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_equal_a_separate_forward_pass(engine: LocalEngine, temperature: float) -> None:
    """At any temperature the engine reports log softmax(logits / T), the distribution it
    sampled from (SGLang's default), and the trainer scores the same at the same T."""
    ids = prompt_ids(engine)
    request = GenerationRequest(ids, max_new_tokens=24, temperature=temperature, seed=5)
    [result] = engine.generate_batch([request])
    assert len(result.ids) == len(result.logprobs) > 0
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids + result.ids])).logits[0].float()
    expected = torch.log_softmax(logits / temperature, -1)[len(ids) - 1 : -1].gather(
        1, torch.tensor(result.ids)[:, None]
    )[:, 0]
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)
    # and the trainer's own scoring function, on a padded batch next to a longer sequence
    from deepdive.local.grpo import token_logprobs

    with torch.no_grad():
        scored = token_logprobs(
            engine.model,
            [ids + result.ids, ids + result.ids + [5] * 7],
            engine.tokenizer.pad_token_id,
            temperature,
        )
    for row in (0, 1):
        trainer_view = scored[row, len(ids) - 1 : len(ids) - 1 + len(result.ids)]
        assert torch.allclose(torch.tensor(result.logprobs), trainer_view, atol=1e-4)
    if temperature != 1.0:
        plain = torch.log_softmax(logits, -1)[len(ids) - 1 : -1]
        plain = plain.gather(1, torch.tensor(result.ids)[:, None])[:, 0]
        assert not torch.allclose(torch.tensor(result.logprobs), plain, atol=1e-3)


def test_a_prompt_pass_projects_only_its_last_position(engine: LocalEngine) -> None:
    """The vocabulary projection of a prompt's pass sees one position per row, not the prompt."""
    widths: list[int] = []
    hook = engine.model.lm_head.register_forward_hook(
        lambda _m, args, _out: widths.append(args[0].shape[1])
    )
    try:
        engine.generate_batch([GenerationRequest(prompt_ids(engine), max_new_tokens=3)])
    finally:
        hook.remove()
    assert len(prompt_ids(engine)) > 1 and widths and set(widths) == {1}


def test_batched_rows_equal_single_rows(engine: LocalEngine) -> None:
    """Left padding and the KV cache do not change what a row generates (greedy)."""
    short, long = (
        prompt_ids(engine, "Who?"),
        prompt_ids(engine, "In which city was the maker of the jade lens born?"),
    )
    alone = [
        engine.generate_batch([GenerationRequest(p, 16, temperature=0)])[0] for p in (short, long)
    ]
    together = engine.generate_batch(
        [GenerationRequest(short, 16, temperature=0), GenerationRequest(long, 16, temperature=0)]
    )
    for a, b in zip(alone, together, strict=True):
        assert a.ids == b.ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_rows_that_are_done_leave_the_batch(engine: LocalEngine) -> None:
    """Once a row has its tokens, the decode passes feed only the rows still decoding, and
    each row still generates what it generates alone (greedy)."""
    prompts = [prompt_ids(engine, q) for q in ("Who?", "Which lens?", "Where was the lute made?")]
    requests = [
        GenerationRequest(p, n, temperature=0) for p, n in zip(prompts, (2, 9, 5), strict=True)
    ]
    alone = [engine.generate_batch([r])[0] for r in requests]
    rows: list[int] = []
    embed = engine.model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    try:
        together = engine.generate_batch(requests)
    finally:
        hook.remove()
    for a, b in zip(alone, together, strict=True):
        assert a.ids == b.ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    decoding = [sum(len(r.ids) > step for r in together) for step in range(1, 9)]
    assert rows == [3, *[n for n in decoding if n]], (rows, [len(r.ids) for r in together])


def test_stops_and_length(engine: LocalEngine) -> None:
    ids = prompt_ids(engine)
    [free] = engine.generate_batch([GenerationRequest(ids, 6, temperature=0)])
    assert free.finish_reason in ("length", "stop") and len(free.ids) <= 6
    first = engine.tokenizer.decode(free.ids[:1])
    [stopped] = engine.generate_batch([GenerationRequest(ids, 6, temperature=0, stop=(first,))])
    assert stopped.finish_reason == "stop" and stopped.ids == free.ids[:1]
    [by_id] = engine.generate_batch(
        [GenerationRequest(ids, 6, temperature=0, stop_token_ids=(free.ids[0],))]
    )
    assert by_id.finish_reason == "stop" and len(by_id.ids) == 1


def first_stop(tokenizer: Any, ids: list[int], stop: str, window: bool) -> int | None:
    """The first token after which `stop` is in the text: the whole text's, or the window's."""
    for end in range(1, len(ids) + 1):
        text = (
            stop_window(tokenizer, ids[:end], (stop,))
            if window
            else tokenizer.decode(ids[:end], skip_special_tokens=False)
        )
        if stop in text:
            return end
    return None


@settings(max_examples=150, deadline=None)
@given(text=st.text(min_size=1, max_size=60), start=st.integers(0, 59), size=st.integers(1, 12))
def test_a_stop_is_found_at_the_same_token_in_the_window_as_in_the_whole_text(
    engine: LocalEngine, text: str, start: int, size: int
) -> None:
    """Over any Unicode (characters split across byte-level tokens included), the stop check on
    the last tokens' text fires exactly where the check on the whole text did."""
    ids = engine.tokenizer.encode(text + TOOL_CALL_CLOSE + text, add_special_tokens=False)
    whole = engine.tokenizer.decode(ids, skip_special_tokens=False)
    for stop in (whole[start : start + size], TOOL_CALL_CLOSE, "\ufffd", "never said"):
        if stop:
            assert first_stop(engine.tokenizer, ids, stop, window=True) == first_stop(
                engine.tokenizer, ids, stop, window=False
            ), (text, stop)


def test_the_http_contract_and_batching(engine: LocalEngine) -> None:
    ids = prompt_ids(engine)
    with serve_in_thread(create_engine_app(engine)) as base:
        payload = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop": [TOOL_CALL_CLOSE]},
            "return_logprob": True,
        }

        async def many() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                replies = await asyncio.gather(
                    *(client.post("/generate", json=payload) for _ in range(6))
                )
            return [r.json() for r in replies]

        engine.batch_sizes.clear()
        bodies = asyncio.run(many())
        assert max(engine.batch_sizes) > 1  # concurrent requests shared forward passes
        first = bodies[0]
        # greedy: the same answer for the same input, whatever batch it landed in
        assert all(b["text"] == first["text"] for b in bodies)
        for body in bodies:
            ours = [p[0] for p in body["meta_info"]["output_token_logprobs"]]
            theirs = [p[0] for p in first["meta_info"]["output_token_logprobs"]]
            assert ours == pytest.approx(theirs, abs=1e-4)
        pairs = first["meta_info"]["output_token_logprobs"]
        assert engine.tokenizer.decode([p[1] for p in pairs]) == first["text"]
        assert first["meta_info"]["finish_reason"]["type"] in ("stop", "length")
        bad = httpx.post(f"{base}/generate", json={"input_ids": []})
        assert bad.status_code == 422 and "input_ids" in bad.json()["error"]["message"]


TOKEN = "engine-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def generate_body(engine: LocalEngine, **params: Any) -> dict[str, Any]:
    return {
        "input_ids": prompt_ids(engine),
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, **params},
    }


def test_generate_needs_the_token_and_the_probes_answer(engine: LocalEngine) -> None:
    """With a token the engine is a service like the others: /generate, /ready and /metrics
    want the bearer token, /health does not, and every generate call is counted."""
    metrics = ServiceMetrics("engine")
    with serve_in_thread(create_engine_app(engine, metrics=metrics, token=TOKEN)) as base:
        body = generate_body(engine)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = httpx.post(f"{base}/generate", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"
        reply = httpx.post(f"{base}/generate", json=body, headers=AUTH, timeout=60)
        assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] > 0
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/ready").status_code == 401
        ready = httpx.get(f"{base}/ready", headers=AUTH)
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert ready.json()["max_batch"] == engine.max_batch
        assert httpx.get(f"{base}/metrics").status_code == 401
        bad = httpx.post(f"{base}/generate", json={"input_ids": "1 2"}, headers=AUTH)
        assert bad.status_code == 422
        exposition = httpx.get(f"{base}/metrics", headers=AUTH).text
    assert 'deepdive_engine_requests_total{operation="generate",outcome="ok"} 1.0' in exposition
    assert (
        'deepdive_engine_requests_total{operation="generate",outcome="invalid_request"} 1.0'
        in exposition
    )
    assert 'deepdive_engine_request_latency_seconds_count{operation="generate"} 2.0' in exposition


MALFORMED: list[tuple[bytes, str]] = [
    (b"", "empty"),
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"sampling_params": {}}', "input_ids"),
    (b'{"input_ids": []}', "input_ids"),
    (b'{"input_ids": [1, "2"]}', "input_ids"),
    (b'{"input_ids": [1, true]}', "input_ids"),
    (b'{"input_ids": [1, 2.5]}', "input_ids"),
    (b'{"input_ids": [-1]}', "input_ids"),
    (b'{"input_ids": [1000000000]}', "input_ids"),
    (b'{"input_ids": [1], "sampling_params": "greedy"}', "sampling_params"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}', "max_new_tokens"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": null}}', "max_new_tokens"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}', "max_new_tokens"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2.5}}', "max_new_tokens"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": true}}', "max_new_tokens"),
    (b'{"input_ids": [1], "sampling_params": {"temperature": "hot"}}', "temperature"),
    (b'{"input_ids": [1], "sampling_params": {"temperature": -0.5}}', "temperature"),
    (b'{"input_ids": [1], "sampling_params": {"top_p": 0}}', "top_p"),
    (b'{"input_ids": [1], "sampling_params": {"top_p": 1.5}}', "top_p"),
    (b'{"input_ids": [1], "sampling_params": {"top_p": [1]}}', "top_p"),
    (b'{"input_ids": [1], "sampling_params": {"stop": 5}}', "stop"),
    (b'{"input_ids": [1], "sampling_params": {"stop": ["a", 1]}}', "stop"),
    (b'{"input_ids": [1], "sampling_params": {"stop_token_ids": "12"}}', "stop_token_ids"),
    (b'{"input_ids": [1], "sampling_params": {"stop_token_ids": [1.5]}}', "stop_token_ids"),
    (b'{"input_ids": [1], "sampling_params": {"sampling_seed": "x"}}', "sampling_seed"),
    (b'{"input_ids": [1], "sampling_params": {"sampling_seed": -3}}', "sampling_seed"),
]


def test_malformed_bodies_are_4xx_naming_the_field(engine: LocalEngine) -> None:
    """Every malformed body is refused before it reaches a batch: a 4xx whose error names the
    field (a JSON error for a body that is not JSON), never a 500 or a traceback."""
    with serve_in_thread(create_engine_app(engine)) as base, httpx.Client(base_url=base) as client:
        for raw, field in MALFORMED:
            reply = client.post(
                "/generate", content=raw, headers={"Content-Type": "application/json"}
            )
            assert 400 <= reply.status_code < 500, (raw, reply.status_code, reply.text)
            error = reply.json()["error"]
            assert error["code"] in ("invalid_request", "invalid_json"), (raw, error)
            assert field in error["message"], (raw, error)
            assert "Traceback" not in reply.text
        reply = client.post("/generate", json=generate_body(engine, stop=""), timeout=60)
        assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 4


def test_a_bad_request_never_fails_the_requests_batched_with_it(engine: LocalEngine) -> None:
    """A request the model cannot run (an unknown token id, a seed torch refuses) used to join a
    batch and fail it whole: its neighbours got a 500 for someone else's mistake."""
    good = generate_body(engine)
    bad_id = {**good, "input_ids": [*good["input_ids"], 10**6]}
    bad_seed = generate_body(engine, sampling_seed="seven")

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            return await asyncio.gather(
                *(client.post("/generate", json=body) for body in (good, bad_id, bad_seed, good))
            )

    with serve_in_thread(create_engine_app(engine)) as base:
        replies = asyncio.run(together())
    assert [r.status_code for r in replies] == [200, 422, 422, 200]
    assert replies[0].json()["text"] == replies[3].json()["text"]


class BrokenModel:
    """A model whose forward pass fails, as an out-of-memory GPU or a bad checkpoint would."""

    def __init__(self, vocab_size: int) -> None:
        self.embed = torch.nn.Embedding(vocab_size, 4)

    def get_input_embeddings(self) -> Any:
        return self.embed

    def parameters(self) -> Any:
        return self.embed.parameters()

    def __call__(self, **_: Any) -> Any:
        raise RuntimeError("CUDA out of memory at /secret/weights/path")


def test_an_engine_failure_is_a_generic_500_and_the_engine_keeps_serving(
    engine: LocalEngine,
) -> None:
    """A failed forward pass answers 500 without internals, is counted, and leaves the batching
    loop serving (ready), so the next request gets its own answer."""
    broken = LocalEngine(BrokenModel(len(engine.tokenizer)), engine.tokenizer, batch_window_s=0)
    metrics = ServiceMetrics("engine")
    with serve_in_thread(create_engine_app(broken, metrics=metrics)) as base:
        for _ in range(2):
            reply = httpx.post(f"{base}/generate", json=generate_body(engine), timeout=60)
            assert reply.status_code == 500
            assert reply.json() == {
                "error": {"code": "internal_error", "message": "internal server error"}
            }
        ready = httpx.get(f"{base}/ready")
        exposition = httpx.get(f"{base}/metrics").text
    assert ready.status_code == 200, ready.text
    assert (
        'deepdive_engine_requests_total{operation="generate",outcome="internal_error"} 2.0'
        in exposition
    )


def test_shutdown_fails_waiting_requests_and_the_engine_serves_again(engine: LocalEngine) -> None:
    """The server's shutdown (`aclose`) answers a request still waiting for its batch with an
    error instead of leaving it hanging, and a later request starts a new batching loop."""
    request = GenerationRequest(prompt_ids(engine), 4, temperature=0)

    async def shut_down_then_serve() -> GenerationResult:
        waiting = asyncio.ensure_future(engine.generate(request))
        await asyncio.sleep(0)  # queued, inside the batching window
        await engine.aclose()
        with pytest.raises(RuntimeError, match="engine"):
            await asyncio.wait_for(waiting, timeout=30)
        assert engine.not_ready_reasons() == {}
        return await asyncio.wait_for(engine.generate(request), timeout=60)

    assert asyncio.run(shut_down_then_serve()).ids == engine.generate_batch([request])[0].ids


def test_weight_updates_change_the_policy(engine: LocalEngine) -> None:
    ids = prompt_ids(engine)
    before = engine.generate_batch([GenerationRequest(ids, 8, temperature=0)])[0]
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    changed = {
        k: v + 0.5 * torch.randn_like(v) if v.dtype.is_floating_point else v
        for k, v in state.items()
    }
    engine.load_state_dict(changed)
    after = engine.generate_batch([GenerationRequest(ids, 8, temperature=0)])[0]
    engine.load_state_dict(state)
    assert after.logprobs != before.logprobs
    assert engine.generate_batch([GenerationRequest(ids, 8, temperature=0)])[0].ids == before.ids


@pytest.mark.anyio
async def test_the_rollout_runs_on_the_engine_with_a_real_tokenizer(
    engine: LocalEngine, corpus_file: Path, tmp_path: Path
) -> None:
    from tests.helpers import reward_app, tool_app

    with (
        serve_in_thread(create_engine_app(engine)) as sglang,
        serve_in_thread(tool_app(corpus_file, tmp_path)) as tools,
        serve_in_thread(reward_app()) as reward,
    ):
        settings = RolloutSettings(
            sglang_url=sglang,
            tool_server_url=((tools,),),
            reward_server_url=(reward,),
            max_turns=3,
            max_context_tokens=2048,
        )
        args = rollout_args(settings, engine.tokenizer)
        messages = [{"role": "user", "content": "Who made the silver lute?"}]
        sample = LocalSample(prompt=messages, label="x")
        sample = await generate_with_tool(args, sample, {"max_new_tokens": 64, "temperature": 1.0})
        await close_clients()
    assert sample.status.name in ("COMPLETED", "TRUNCATED", "FAILED")
    assert isinstance(sample.prompt, str) and sample.prompt.endswith("<|im_start|>assistant\n")
    assert sample.tokens[: len(prompt_ids_for(engine, messages))] == prompt_ids_for(
        engine, messages
    )
    assert (
        len(sample.loss_mask)
        == sample.response_length
        == len(sample.rollout_log_probs)
        == len(sample.tokens) - len(prompt_ids_for(engine, messages))
    )


def prompt_ids_for(engine: LocalEngine, messages: list[dict[str, str]]) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
    return ids


@pytest.mark.slow
def test_serve_engine_command_serves_a_saved_model_behind_the_token(
    engine: LocalEngine, tmp_path: Path
) -> None:
    """`deepdive serve engine` with the service token set (on loopback, as every test server:
    once set, the token is asked for on any address): /generate refuses a client without it,
    answers one with it (the same ids as the engine in this process), and /ready and
    /metrics, which the start-up line advertises, answer."""
    import os
    import subprocess
    import sys
    import time

    from tests.helpers import DEEPDIVE

    folder = tmp_path / "policy"
    engine.model.save_pretrained(folder)
    engine.tokenizer.save_pretrained(folder)
    command = [*DEEPDIVE, "serve", "engine", "--model", str(folder), "--port", "0"]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, TOKEN_ENV: TOKEN},
    )
    try:
        assert process.stderr is not None
        announced = ""
        for _ in range(200):
            line = process.stderr.readline()
            announced += line
            if "listening on" in line or not line:
                break
        port = announced.split("listening on ")[1].split()[0].rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        body = generate_body(engine)
        refused = httpx.post(f"{base}/generate", json=body, timeout=60)
        assert refused.status_code == 401, refused.text
        reply = httpx.post(f"{base}/generate", json=body, headers=AUTH, timeout=60)
        expected = engine.generate_batch([GenerationRequest(prompt_ids(engine), 4, temperature=0)])
        assert [p[1] for p in reply.json()["meta_info"]["output_token_logprobs"]] == expected[0].ids
        assert httpx.get(f"{base}/ready", headers=AUTH).json()["status"] == "ready"
        metrics = httpx.get(f"{base}/metrics", headers=AUTH)
        assert 'deepdive_engine_requests_total{operation="generate",outcome="ok"} 1.0' in (
            metrics.text
        )
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=20)  # reads and closes stderr
    assert "Traceback" not in announced + rest
    missing = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "serve", "engine", "--model", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no config.json" in missing.stderr
