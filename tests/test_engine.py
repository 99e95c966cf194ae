"""The local inference engine: SGLang's /generate contract, exact log-probs, stops, batching,
and the rollout driving it with a real tokenizer."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from deepdive.clients import close_clients  # noqa: E402
from deepdive.command import write_world  # noqa: E402
from deepdive.engine import GenerationRequest, LocalEngine, create_engine_app  # noqa: E402
from deepdive.local_model import new_model, train_tokenizer  # noqa: E402
from deepdive.protocol import TOOL_CALL_CLOSE  # noqa: E402
from deepdive.rollout import generate_with_tool  # noqa: E402
from deepdive.sample import LocalSample  # noqa: E402
from deepdive.world import WorldSizes  # noqa: E402
from tests.conftest import serve_in_thread  # noqa: E402


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
    from deepdive.grpo import token_logprobs

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
        assert bad.status_code == 400 and "input_ids" in bad.json()["error"]["message"]


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
    from tests.test_rollout import reward_app, tool_app

    with (
        serve_in_thread(create_engine_app(engine)) as sglang,
        serve_in_thread(tool_app(corpus_file, tmp_path)) as tools,
        serve_in_thread(reward_app()) as reward,
    ):
        args = Namespace(
            deepdive_sglang_url=sglang,
            deepdive_tool_server_url=tools,
            deepdive_reward_server_url=reward,
            deepdive_tokenizer=engine.tokenizer,
            deepdive_max_turns=3,
            rollout_max_context_len=2048,
        )
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


def test_serve_engine_command_serves_a_saved_model(engine: LocalEngine, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.test_cli import DEEPDIVE

    folder = tmp_path / "policy"
    engine.model.save_pretrained(folder)
    engine.tokenizer.save_pretrained(folder)
    process = subprocess.Popen(
        [*DEEPDIVE, "serve", "engine", "--model", str(folder), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        base = None
        for _ in range(200):
            line = process.stderr.readline()
            if "listening on" in line:
                base = line.split("listening on ")[1].split()[0]
                break
        assert base is not None
        for _ in range(200):
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                import time

                time.sleep(0.05)
        reply = httpx.post(
            f"{base}/generate",
            json={
                "input_ids": prompt_ids(engine),
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            },
            timeout=60,
        )
        expected = engine.generate_batch([GenerationRequest(prompt_ids(engine), 4, temperature=0)])[
            0
        ]
        assert [p[1] for p in reply.json()["meta_info"]["output_token_logprobs"]] == expected.ids
    finally:
        process.terminate()
        process.communicate(timeout=20)  # reads and closes stderr
    missing = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "serve", "engine", "--model", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no config.json" in missing.stderr
