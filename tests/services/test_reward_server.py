"""The reward server for real: uvicorn on loopback, both client payloads, batch, errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deepdive.protocol import FINISH, format_observation, format_tool_call
from services.reward_server.app import create_app
from services.reward_server.build import build_judge
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.judging import Verdict
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics
from tests.helpers import serve_in_thread

QUESTION = "Which city hosted the 1889 World's Fair?"
GOOD = (
    format_tool_call("search", {"query": "1889 World's Fair"})
    + format_observation("...")
    + format_tool_call(FINISH, {"answer": "Paris"})
)
CHATML = f"<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


def make_app(token: str | None = None, **overrides: Any) -> Any:
    config = RewardServerConfig(**overrides)
    metrics = ServiceMetrics("reward")
    return create_app(
        config, Evaluator(build_judge(config, metrics), config.deadline_s), metrics, token=token
    )


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with serve_in_thread(make_app()) as base, httpx.Client(base_url=base) as c:
        yield c


def test_slime_remote_rm_payload(client: httpx.Client) -> None:
    response = client.post("/evaluate", json={"prompt": CHATML, "response": GOOD, "label": "Paris"})
    assert response.status_code == 200
    assert response.json() == {
        "reward": 1,
        "format_ok": True,
        "format_reason": None,
        "answer_ok": True,
        "extracted_answer": "Paris",
        "judge": {"name": "rule", "verdict": "correct", "reason": "matches 'Paris'"},
        "error": None,
    }


def test_the_question_is_read_from_the_chat_prompt(client: httpx.Client) -> None:
    hack = format_tool_call(FINISH, {"answer": QUESTION})
    body = client.post(
        "/evaluate", json={"prompt": CHATML, "response": hack, "label": QUESTION + "x"}
    ).json()
    assert body["reward"] == 0 and body["judge"]["reason"] == "the answer repeats the question"


def test_deepdive_payload_with_history_and_flags(client: httpx.Client) -> None:
    history = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": format_tool_call("search", {"query": "1889 fair"})},
        {"role": "tool", "content": "【1】Exposition Universelle ... Paris"},
        {"role": "assistant", "content": format_tool_call(FINISH, {"answer": "Paris"})},
    ]
    payload = {
        "history": history,
        "label": ["Paris"],
        "remote_env_info": {"forbidden_texts": [QUESTION]},
    }
    assert client.post("/evaluate", json=payload).json()["reward"] == 1
    unfinished = client.post("/evaluate", json={**payload, "task_unfinished": True}).json()
    assert unfinished["reward"] == 0 and unfinished["format_ok"] is False
    invalid = client.post("/evaluate", json={**payload, "format_valid": False}).json()
    assert invalid["reward"] == 0
    # a client flag can only make it stricter: format_valid=true does not rescue a bad trajectory
    lenient = client.post(
        "/evaluate", json={"response": "Paris", "label": "Paris", "format_valid": True}
    ).json()
    assert lenient["reward"] == 0


def test_label_forms(client: httpx.Client) -> None:
    answer = format_tool_call(FINISH, {"answer": "City of Light"})
    for label in (["Paris", "City of Light"], {"answer": "Paris", "aliases": ["City of Light"]}):
        assert (
            client.post("/evaluate", json={"response": answer, "label": label}).json()["reward"]
            == 1
        )
    numeric = format_tool_call(FINISH, {"answer": "1,889"})
    assert client.post("/evaluate", json={"response": numeric, "label": 1889}).json()["reward"] == 1


SUPERSCRIPT_CALL = '<tool_call>{"name": "click", "arguments": {"link_id": "\u00b2"}}</tool_call>'


def test_an_odd_tool_call_scores_0_and_the_batch_keeps_the_rest(client: httpx.Client) -> None:
    # "²" passed str.isdigit() and int() raised: /evaluate answered 500, and /evaluate/batch
    # 500 for the whole group.
    odd = (
        SUPERSCRIPT_CALL + format_observation("...") + format_tool_call(FINISH, {"answer": "Paris"})
    )
    single = client.post("/evaluate", json={"response": odd, "label": "Paris"})
    assert single.status_code == 200 and single.json()["reward"] == 0
    assert single.json()["format_reason"].startswith("tool call 1:")
    items = [{"response": r, "label": "Paris"} for r in (GOOD, GOOD, odd, GOOD)]
    response = client.post("/evaluate/batch", json=items)
    assert response.status_code == 200
    assert [r["reward"] for r in response.json()] == [1, 1, 0, 1]


class FailingJudge(RuleJudge):
    """A judge with a bug for one answer: what a batch must survive."""

    async def judge(
        self, question: str, labels: tuple[str, ...], answer: str, deadline: float
    ) -> Verdict:
        if answer == "boom":
            raise RuntimeError("a bug in a judge")
        return await super().judge(question, labels, answer, deadline)


def test_a_bug_on_one_item_costs_only_that_item(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ServiceMetrics("reward")
    app = create_app(RewardServerConfig(), Evaluator(FailingJudge(), 10), metrics)
    boom = format_tool_call(FINISH, {"answer": "boom"})
    items = [{"response": r, "label": "Paris"} for r in (GOOD, boom, GOOD)]
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as c:
        batch = c.post("/evaluate/batch", json=items)
        single = c.post("/evaluate", json=items[1])
    assert batch.status_code == 200 and [r["reward"] for r in batch.json()] == [1, 0, 1]
    assert batch.json()[1]["error"]["code"] == "internal_error"
    assert single.status_code == 200 and single.json()["error"]["code"] == "internal_error"
    assert "RuntimeError" in caplog.text and "a bug in a judge" not in single.text
    assert 'outcome="internal_error"' in metrics.render().decode()


def test_batch_keeps_order(client: httpx.Client) -> None:
    wrong = format_tool_call(FINISH, {"answer": "Lyon"})
    items = [{"response": r, "label": "Paris"} for r in (GOOD, wrong, "no finish", GOOD)]
    response = client.post("/evaluate/batch", json=items)
    assert [r["reward"] for r in response.json()] == [1, 0, 0, 1]
    wrapped = client.post("/evaluate/batch", json={"items": items[:2]})
    assert [r["reward"] for r in wrapped.json()] == [1, 0]


@pytest.mark.parametrize(
    ("path", "payload", "status", "fragment"),
    [
        ("/evaluate", b"{oops", 400, "not valid JSON"),
        ("/evaluate", b"[]", 422, "JSON object"),
        ("/evaluate", b'{"response": "x"}', 422, "field 'label': missing"),
        (
            "/evaluate",
            b'{"response": 5, "label": "a"}',
            422,
            "field 'response': expected a string, got an integer",
        ),
        ("/evaluate", b'{"label": "a"}', 422, "send 'response' or 'history'"),
        ("/evaluate", b'{"history": {}, "label": "a"}', 422, "field 'history'"),
        (
            "/evaluate",
            b'{"history": [{"role": "user", "content": 3}], "label": "a"}',
            422,
            "history[0].content",
        ),
        ("/evaluate", b'{"response": "x", "label": ""}', 422, "empty value"),
        ("/evaluate", b'{"response": "x", "label": [true]}', 422, "field 'label'"),
        (
            "/evaluate",
            b'{"response": "x", "label": "a", "task_unfinished": "yes"}',
            422,
            "field 'task_unfinished'",
        ),
        (
            "/evaluate",
            b'{"response": "x", "label": "a", "remote_env_info": {"forbidden_texts": [1]}}',
            422,
            "forbidden_texts",
        ),
        ("/evaluate/batch", b'{"response": "x"}', 422, "JSON list"),
        (
            "/evaluate/batch",
            b'[{"response": "x", "label": "a"}, {"response": "x"}]',
            422,
            "item 1: field 'label'",
        ),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    client: httpx.Client, path: str, payload: bytes, status: int, fragment: str
) -> None:
    response = client.post(path, content=payload)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


def test_oversized_bodies_and_batches_are_refused() -> None:
    with serve_in_thread(make_app(max_body_bytes=1_000, max_batch=2)) as base:
        big = {"response": "x" * 5_000, "label": "a"}
        assert httpx.post(f"{base}/evaluate", json=big).status_code == 413
        three = [{"response": "x", "label": "a"}] * 3
        response = httpx.post(f"{base}/evaluate/batch", json=three)
        assert response.status_code == 422 and "limit is 2" in response.json()["error"]["message"]


def test_probes_metrics_and_auth() -> None:
    with serve_in_thread(make_app(token="reward-token-123")) as base:
        headers = {"Authorization": "Bearer reward-token-123"}
        assert httpx.get(f"{base}/health").status_code == 200
        assert (
            httpx.post(f"{base}/evaluate", json={"response": GOOD, "label": "Paris"}).status_code
            == 401
        )
        assert httpx.get(f"{base}/ready", headers=headers).json() == {
            "status": "ready",
            "judge": "rule",
        }
        httpx.post(f"{base}/evaluate", json={"response": GOOD, "label": "Paris"}, headers=headers)
        httpx.post(f"{base}/evaluate", json={"response": "yes", "label": "Paris"}, headers=headers)
        text = httpx.get(f"{base}/metrics", headers=headers).text
    assert 'deepdive_reward_requests_total{operation="evaluate",outcome="reward_1"} 1.0' in text
    assert (
        'deepdive_reward_requests_total{operation="evaluate",outcome="format_unfinished"} 1.0'
        in text
    )
