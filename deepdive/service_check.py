"""Our tool and reward servers, checked before the rollout first uses them: a wrong URL stops
the run with its setting named, instead of training on error observations and zero rewards.

`checked_client` hands out the shared client (deepdive.clients) once its URL has answered
`GET /health` as our services do (`{"status": "ok"}`, without auth). Per event loop and
(service, URL) there is one check, shared by every caller (single flight): hundreds of
episodes starting at once send one probe and wait on it.

What the check concludes:
- our health answer: checked, for good (on this loop);
- any 4xx (404/405 above all: a path such as `.../wrong` or a full endpoint where the base
  belongs), or a 200 that is not our health JSON: a `ConfigError` naming the setting, raised to
  every caller now and later; the run stops;
- a transport failure, 5xx or 429 after the client's retries (the server is not up yet): not a
  configuration error. Logged (`service_unchecked`), the caller goes on to its own call and
  that call's usual error path (a tool-error observation, a 0.0 reward), and the next call
  checks again, still one probe at a time, so the URL is checked once the server answers.

During calls, the same clients read 404/405 from our services as a wrong URL (`ConfigError`):
our routes answer a malformed call or a failed tool with 200 or 400/413/422, never 404/405,
so nothing a model writes can stop the run this way.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import orjson

from deepdive.clients import PerLoop, service_client
from deepdive.rollout_settings import arg_name
from services.base.errors import ConfigError, DeepDiveError, UpstreamAuthError, UpstreamBadResponse
from services.base.logs import log_event
from services.client.http import ErrorClassifier, Upstream, UpstreamReply

logger = logging.getLogger("deepdive.service_check")

# A probe never waits longer than this (the caller's own timeout may be ten minutes).
PROBE_TIMEOUT_S = 30.0
_WRONG_ROUTE = frozenset({404, 405})


@dataclass(frozen=True)
class OurService:
    """One of our services as the rollout reaches it, and how an error names its setting."""

    name: str  # the client's name in logs and errors
    label: str
    setting: str
    example: str
    routes: str

    def wrong_url(self, url: str, found: str) -> ConfigError:
        return ConfigError(
            f"{self.setting}={shown_url(url)}: {found}, so the {self.label} is not there; "
            f"expected its base URL, such as {self.example}, where {self.routes}"
        )

    def classifier(self, url: str) -> ErrorClassifier:
        """404/405 from our routes mean the URL is wrong: a ConfigError, never retried."""

        def classify(reply: UpstreamReply) -> DeepDiveError | None:
            if reply.status_code in _WRONG_ROUTE:
                return self.wrong_url(url, f"HTTP {reply.status_code} (no such route)")
            return None

        return classify


_CLASSIFIERS: dict[tuple[str, str], ErrorClassifier] = {}


def _classifier(service: OurService, url: str) -> ErrorClassifier:
    """The service's classifier for `url`, made once (it is asked for on every call)."""
    key = (service.name, url)
    found = _CLASSIFIERS.get(key)
    if found is None:
        found = _CLASSIFIERS[key] = service.classifier(url)
    return found


TOOL_SERVER = OurService(
    "tool_server",
    "tool server",
    arg_name("tool_server_url"),
    "http://host:8700",
    "POST /tool lives",
)
REWARD_SERVER = OurService(
    "reward_server",
    "reward server",
    arg_name("reward_server_url"),
    "http://host:8701",
    "POST /evaluate and /evaluate/batch live",
)


class _Checked(enum.Enum):
    OK = "ok"
    UNCHECKED = "unchecked"  # the server did not answer; check again at the next call


_Outcome = _Checked | ConfigError
_Check = asyncio.Task[_Outcome] | _Outcome
# Per loop: (service, URL) -> the probe in flight, or what it found (never a finished task,
# which would hold its loop alive from inside this weak-keyed map).
_CHECKS: PerLoop[dict[tuple[str, str], _Check]] = PerLoop(dict)


async def checked_client(service: OurService, url: str, timeout_s: float, retries: int) -> Upstream:
    """The shared client for `service` at `url`, once `url` is known to be ours. Raises
    `ConfigError` (naming the setting) when it is not; see the module docstring."""
    checks = _CHECKS.get()
    key = (service.name, url)
    state = checks.get(key)
    client = service_client(service.name, url, timeout_s, retries, _classifier(service, url))
    if state is _Checked.OK:  # the usual case, every turn
        return client
    loop = asyncio.get_running_loop()
    if state is None:
        state = loop.create_task(_probe(service, client, url, timeout_s))
        checks[key] = state
        state.add_done_callback(lambda done: _settle(checks, key, done))
    # shielded: a cancelled episode never cancels the probe the others wait on
    outcome = await asyncio.shield(state) if isinstance(state, asyncio.Task) else state
    if isinstance(outcome, ConfigError):
        raise ConfigError(outcome.message)  # a fresh one each time: tracebacks stay short
    return client


def _settle(checks: dict[tuple[str, str], _Check], key: tuple[str, str], done: _Check) -> None:
    """Keep what a finished probe found; forget one that found nothing, or failed."""
    if checks.get(key) is not done or not isinstance(done, asyncio.Task):
        return
    if done.cancelled() or done.exception() is not None or done.result() is _Checked.UNCHECKED:
        del checks[key]
    else:
        checks[key] = done.result()


async def _probe(service: OurService, client: Upstream, url: str, timeout_s: float) -> _Outcome:
    """One GET /health, with the client's retries, read as the module docstring says."""
    deadline = time.monotonic() + min(timeout_s, PROBE_TIMEOUT_S)
    try:
        reply = await client.send("GET", "/health", deadline=deadline)
    except ConfigError as error:  # 404/405, from the client's classifier
        return error
    except (UpstreamAuthError, UpstreamBadResponse) as error:  # another 4xx, or too large
        detail = error.message.removeprefix(f"{error.upstream}: ")
        return service.wrong_url(url, f"GET /health was refused ({detail}), which ours never is")
    except DeepDiveError as error:  # transport, 5xx or 429 after every retry
        log_event(
            logger,
            "service_unchecked",
            logging.WARNING,
            service=service.name,
            url=shown_url(url),
            error=error.message,
            then="checked again at the next call",
        )
        return _Checked.UNCHECKED
    if not _is_our_health(reply.content):
        return service.wrong_url(
            url, f'GET /health answered HTTP {reply.status_code} but not {{"status": "ok"}}'
        )
    log_event(logger, "service_checked", service=service.name, url=shown_url(url))
    return _Checked.OK


def _is_our_health(content: bytes) -> bool:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and body.get("status") == "ok"


def shown_url(url: str) -> str:
    """`url` fit for a log line or an error: any user:password@ taken out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an invalid URL>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
