"""Thousands of malformed requests against the real server, and not one 500 (hypothesis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.conftest import serve_in_thread

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
tool_names = st.sampled_from(
    ["search", "click", "open", "start_session", "close_session", "", "Search"]
) | st.text(max_size=12)
argument_values = st.dictionaries(
    st.sampled_from(["query", "num", "link_id", "url", "page"]) | st.text(max_size=6),
    json_values
    | st.sampled_from(["https://wiki.example/Haldor", "3", "-1", "1e9", "http://127.0.0.1/"]),
    max_size=4,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "session_id": st.text(max_size=300) | json_values,
        "name": tool_names | json_values,
        "arguments": argument_values | json_values,
        "remote_env_info": st.fixed_dictionaries(
            {}, optional={"forbidden_texts": st.lists(st.text(max_size=80)) | json_values}
        )
        | json_values,
    },
)
bodies = (
    envelopes.map(orjson.dumps)
    | json_values.map(orjson.dumps)
    | st.binary(max_size=200)
    | envelopes.map(lambda e: orjson.dumps(e)[:-1])  # truncated JSON
)


def test_no_malformed_request_gets_a_500(corpus_file: Path, tmp_path: Path) -> None:
    config = ToolServerConfig(
        corpus=corpus_file, index_cache_dir=tmp_path / "idx", page_chars=300, call_deadline_s=5
    )
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    app = create_app(ToolExecutor(config, search, reader, metrics), metrics)
    seen: set[int] = set()

    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:

        @settings(
            max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(body=bodies)
        def check(body: bytes) -> None:
            response = client.post(
                "/tool", content=body, headers={"content-type": "application/json"}
            )
            seen.add(response.status_code)
            assert response.status_code in (200, 400, 413, 422), response.text
            payload: Any = response.json()
            if response.status_code == 200:
                assert (
                    isinstance(payload["output"], str)
                    and payload["output"] == payload["observation"]
                )
            else:
                assert payload["error"]["code"] and payload["error"]["message"]

        check()
    assert {200, 400, 422} <= seen  # the generator really reached every kind of answer
