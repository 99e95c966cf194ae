"""Hypothesis strategies for what a model (or an attacker) may write: arbitrary Unicode in every
string, numbers that only look like numbers, and tool calls built from both.

Shared by the protocol, tool-server, reward-server and rollout fuzz tests, so that each of them
is fed the same hostile shapes.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

# Characters that str.isdigit() accepts but int() refuses, digits of other scripts, and the
# format characters (zero-width, soft hyphen, BOM) that hide inside words.
DIGIT_LOOKALIKES = "²³¹⁰⁴⁵⁹₀₁₂①⑴⒈\u0663\u0969\uff13\U0001d7d1"
FORMAT_CHARACTERS = "\u00ad\u200b\u200c\u200d\u2060\ufeff"

unicode_text = st.text(
    st.characters(codec="utf-8") | st.sampled_from(DIGIT_LOOKALIKES + FORMAT_CHARACTERS),
    max_size=40,
)
number_like = (
    st.text(st.sampled_from("123" + DIGIT_LOOKALIKES), min_size=1, max_size=3)
    | st.text(
        st.sampled_from("0123456789" + DIGIT_LOOKALIKES + FORMAT_CHARACTERS + " -+.e"), max_size=12
    )
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        ["²", "¹²³", "\u0663", "\uff13", "1e9", "-1", "0", "9" * 40, " 3 ", "3\u200b"]
    )
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | unicode_text
    | number_like
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(unicode_text, children, max_size=4)
    ),
    max_leaves=12,
)
tool_names = st.sampled_from(["search", "click", "open", "finish", "", "Search"]) | unicode_text
argument_keys = st.sampled_from(["query", "num", "link_id", "url", "page", "answer"]) | unicode_text
urls = st.sampled_from(
    [
        "http://xn--/",
        "https://xn--ls8h.la/",
        "http://xn--127-0.0.0.1/",
        "http://0177.0.0.1/",
        "http://[::1]/",
        "https://wiki.example/Haldor",
        "http://127.0.0.1/",
        "http://%zz/",
        "http://a b/",
        "javascript:alert(1)",
    ]
) | unicode_text.map(lambda text: "http://" + text)
# Arguments shaped like a real call (every key a tool reads, each optional), with numbers that
# may only look like numbers, and arbitrary dictionaries.
tool_arguments = st.fixed_dictionaries(
    {},
    optional={
        "query": st.just("silver orrery") | unicode_text,
        "url": urls,
        "answer": unicode_text,
        "num": number_like,
        "link_id": number_like,
        "page": number_like,
    },
) | st.dictionaries(argument_keys, json_values | number_like | urls, max_size=4)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


tool_call_bodies = (
    st.builds(
        lambda name, args: _json({"name": name, "arguments": args}), tool_names, tool_arguments
    )
    | st.builds(
        lambda name, args: _json({"name": name, "arguments": args}), tool_names, json_values
    )
    | unicode_text
)
model_turns = (
    st.builds(
        lambda before, body, closed: (
            f"{before}<tool_call>{body}" + ("</tool_call>" if closed else "")
        ),
        unicode_text,
        tool_call_bodies,
        st.booleans(),
    )
    | unicode_text
)
