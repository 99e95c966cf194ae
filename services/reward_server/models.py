"""What clients send, turned into one `EvaluationRequest`.

Two payloads arrive at POST /evaluate:
- slime's remote_rm:   {"prompt": str | messages, "response": str, "label": any}
- DeepDive's rollout:  {"response" | "history", "label", "task_unfinished", "format_valid",
                        "remote_env_info": {"forbidden_texts": [question, ...]}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from deepdive.protocol import format_observation
from services.base.errors import RequestError
from services.web import MISSING, json_kind

_CHATML_USER = re.compile(r"<\|im_start\|>user\s*\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class EvaluationRequest:
    trajectory: str
    labels: tuple[str, ...]  # the reference answer first, then its aliases
    question: str
    client_unfinished: bool = False  # the client says the task was unfinished or truncated
    client_format_invalid: bool = False  # the client says the format is invalid


def parse_evaluation_request(body: Any, where: str = "") -> EvaluationRequest:
    """Validate one payload; `RequestError` names the field (prefixed by `where` in a batch)."""
    if not isinstance(body, dict):
        raise RequestError(f"{where}the request must be a JSON object, got {json_kind(body)}")
    labels = _labels(body.get("label", MISSING), where)
    history = body.get("history", MISSING)
    response = body.get("response", MISSING)
    if response is not MISSING and response is not None:
        if not isinstance(response, str):
            raise RequestError(
                f"{where}field 'response': expected a string, got {json_kind(response)}"
            )
        trajectory = response
    elif history is not MISSING and history is not None:
        trajectory = _trajectory_from_history(history, where)
    else:
        raise RequestError(f"{where}field 'response': missing (send 'response' or 'history')")
    env = body.get("remote_env_info") or {}
    if not isinstance(env, dict):
        raise RequestError(
            f"{where}field 'remote_env_info': expected an object, got {json_kind(env)}"
        )
    forbidden = env.get("forbidden_texts") or []
    if not isinstance(forbidden, list) or not all(isinstance(t, str) for t in forbidden):
        raise RequestError(
            f"{where}field 'remote_env_info.forbidden_texts': expected a list of strings"
        )
    question = forbidden[0] if forbidden else _question(body, where)
    unfinished = _flag(body, "task_unfinished", where) or _flag(body, "truncated", where)
    format_valid = body.get("format_valid", True)
    if not isinstance(format_valid, bool):
        raise RequestError(
            f"{where}field 'format_valid': expected true or false, got {json_kind(format_valid)}"
        )
    return EvaluationRequest(trajectory, labels, question, unfinished, not format_valid)


def _labels(label: Any, where: str) -> tuple[str, ...]:
    expected = "expected a non-empty string, a number, a list of strings, or {answer, aliases}"
    values: list[Any]
    if label is MISSING or label is None:
        raise RequestError(f"{where}field 'label': missing ({expected})")
    if isinstance(label, dict):
        aliases = label.get("aliases") or []
        if not isinstance(aliases, list):
            raise RequestError(f"{where}field 'label.aliases': expected a list of strings")
        values = [label.get("answer"), *aliases]
    elif isinstance(label, list):
        values = label
    else:
        values = [label]
    texts = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise RequestError(f"{where}field 'label': {expected}, got {json_kind(value)} inside")
        text = str(value).strip()
        if text:
            texts.append(text)
    if not texts:
        raise RequestError(f"{where}field 'label': {expected}, got an empty value")
    return tuple(texts)


def _trajectory_from_history(history: Any, where: str) -> str:
    """DeepDive's message list as one trajectory: assistant turns as written, every later
    non-assistant message as an observation."""
    if not isinstance(history, list):
        raise RequestError(
            f"{where}field 'history': expected a list of messages, got {json_kind(history)}"
        )
    parts: list[str] = []
    seen_assistant = False
    for index, message in enumerate(history):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"{where}field 'history[{index}]': expected {{role, content}}")
        content = message.get("content", "")
        if not isinstance(content, str):
            raise RequestError(f"{where}field 'history[{index}].content': expected a string")
        if message["role"] == "assistant":
            seen_assistant = True
            parts.append(content)
        elif seen_assistant:
            parts.append(
                content
                if content.lstrip().startswith("<observation>")
                else format_observation(content)
            )
    return "\n".join(parts)


def _question(body: dict[str, Any], where: str) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        users = _CHATML_USER.findall(prompt)
        return (users[-1] if users else prompt).strip()
    messages = prompt if isinstance(prompt, list) else body.get("history")
    if isinstance(messages, list):
        for message in messages:
            if (
                isinstance(message, dict)
                and message.get("role") == "user"
                and isinstance(message.get("content"), str)
            ):
                return str(message["content"]).strip()
    if prompt is not None and not isinstance(prompt, list):
        raise RequestError(
            f"{where}field 'prompt': expected a string or a list of messages, got {json_kind(prompt)}"
        )
    return ""


def _flag(body: dict[str, Any], name: str, where: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{where}field '{name}': expected true or false, got {json_kind(value)}")
    return value
