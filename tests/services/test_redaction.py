"""Secrets never leave a service: not in a log line, not in any JSON response, in any encoding.

An upstream may echo a key back (in a search snippet, a page, a judge's reasoning); the key may
travel percent-encoded (SerpAPI's query string) or JSON-escaped. Every JSON response is redacted
where it is serialised, so these tests go through the real servers and read the real bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import orjson
import pytest
from pytest_httpserver import HTTPServer

from deepdive.protocol import FINISH, format_tool_call
from services.base.logs import redact, register_secret
from services.client.http import UpstreamSettings
from services.client.retries import RetryPolicy
from services.reward_server.app import create_app
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.openai_judge import OpenAIJudge
from services.serving.metrics import ServiceMetrics
from services.web import json_response
from tests.helpers import serve_in_thread

URL_SPECIAL = "k3y/with+special=chars&x"  # every character URL encoders disagree about
JSON_SPECIAL = 'q"uote\\back/slash key 42'  # a quote, a backslash, a slash and spaces
JUDGE_KEY = "judge-redaction-key-0123456789"
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02)


def _lower_hex(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), text)


def encodings(secret: str) -> dict[str, str]:
    """The forms a secret takes on its way through URLs and JSON documents."""
    forms = {
        "raw": secret,
        "quote_safe_empty": quote(secret, safe=""),
        "quote_default_safe": quote(secret),
        "quote_plus": quote_plus(secret),
        "quote_plus_slash_safe": quote_plus(secret, safe="/"),
        "json_escaped": json.dumps(secret)[1:-1],
        "json_escaped_slash": json.dumps(secret)[1:-1].replace("/", "\\/"),
    }
    for name, form in list(forms.items()):
        if name.startswith("quote"):
            forms[f"{name}_lower_hex"] = _lower_hex(form)
    return forms


register_secret(URL_SPECIAL)
register_secret(JSON_SPECIAL)


@pytest.mark.parametrize("secret", [URL_SPECIAL, JSON_SPECIAL])
def test_every_encoding_of_a_secret_is_redacted_from_text(secret: str) -> None:
    for name, form in encodings(secret).items():
        assert redact(f"before {form} after") == "before *** after", name


def test_short_values_are_never_registered() -> None:
    register_secret("ab/c=")
    assert redact("ab/c= and ab%2Fc%3D stay") == "ab/c= and ab%2Fc%3D stay"


@pytest.mark.parametrize("secret", [URL_SPECIAL, JSON_SPECIAL])
def test_json_responses_are_redacted_in_every_encoding(secret: str) -> None:
    forms = encodings(secret)
    text = " | ".join(forms.values())
    body = bytes(json_response({"observation": text, "nested": [{"deep": text}]}).body)
    decoded = orjson.loads(body)  # replacing inside the serialised bytes keeps it valid JSON
    for name, form in forms.items():
        assert form not in decoded["observation"], name
        assert form not in decoded["nested"][0]["deep"], name
        assert orjson.dumps(form)[1:-1] not in body, name
    assert decoded["observation"].count("***") == len(forms)


def test_a_judge_that_repeats_its_key_never_shows_it(httpserver: HTTPServer) -> None:
    reasoning = (
        f"my request carried Authorization: Bearer {JUDGE_KEY} "
        f"(url-encoded {quote(JUDGE_KEY, safe='')})"
    )
    content = f"extracted_final_answer: Paris\n\nreasoning: {reasoning}\n\ncorrect: yes"
    reply: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": content}}]}
    httpserver.expect_request("/v1/chat/completions").respond_with_json(reply)
    settings = UpstreamSettings(httpserver.url_for("/v1"), retry=FAST, read_timeout_s=5)
    metrics = ServiceMetrics("reward")
    judge = OpenAIJudge(settings, JUDGE_KEY, metrics=metrics)  # not through read_secret
    app = create_app(RewardServerConfig(), Evaluator(judge, 10), metrics)
    trajectory = format_tool_call(FINISH, {"answer": "Paris"})
    with serve_in_thread(app) as base:
        response = httpx.post(f"{base}/evaluate", json={"response": trajectory, "label": "Paris"})
    assert httpserver.log[0][0].headers["Authorization"] == f"Bearer {JUDGE_KEY}"
    body = response.json()
    assert body["reward"] == 1
    assert body["judge"]["reason"].startswith("my request carried Authorization: Bearer ***")
    assert JUDGE_KEY not in response.text and quote(JUDGE_KEY, safe="") not in response.text
