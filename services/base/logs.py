"""One line per event, key=value, with every known secret redacted before it is written.

Why a redacting filter: a secret can reach a log through a third-party message (an exception that
quotes a URL with `api_key=` in it), not only through our own calls. The filter is the last line
of defence; our own code never logs request bodies, headers or upstream URLs in the first place.

The same registry cleans every JSON response (the servers' `json_response`): an upstream can
echo a key back into what the model reads. A key is matched in each form it travels in (raw,
percent-encoded, JSON-escaped), worked out once when it is registered.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, AnyStr
from urllib.parse import quote, quote_plus

import orjson
import yarl

from services.base.clock import SYSTEM_CLOCK, Clock

_MIN_SECRET_CHARS = 6
_REDACTED = "***"
_REDACTED_BYTES = b"***"
_PERCENT_ESCAPE = re.compile(r"%[0-9A-F]{2}")
# Characters no URL encoder and no JSON writer ever changes (RFC 3986 "unreserved").
_UNRESERVED_RUN = re.compile(r"[A-Za-z0-9._~-]+")

# (anchor, forms): `anchor` is a substring of every one of `forms`, so a text without the
# anchor holds none of them and costs one substring search per secret, whatever its forms.
_Rule = tuple[AnyStr, tuple[AnyStr, ...]]

_register_lock = threading.Lock()
_SECRETS: set[str] = set()
# Rebuilt whole at registration and swapped in, so readers never need the lock.
_TEXT_RULES: tuple[_Rule[str], ...] = ()
_JSON_RULES: tuple[_Rule[bytes], ...] = ()


def secret_forms(value: str) -> frozenset[str]:
    """The texts `value` can appear as once it has travelled: raw; percent-encoded the ways
    URL encoders do it (nothing safe, "/" safe, quote_plus's "+" for space, yarl's query-value
    rules; upper- or lower-case hex); and each of those escaped as inside a JSON string
    (backslash-escaped quote and backslash, optionally an escaped slash or \\uXXXX)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # an undecodable environment value: only its raw form exists
        return frozenset({value})
    encoded = {
        value,
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
        quote_plus(value, safe="/"),
        yarl.URL("http://h/").with_query({"k": value}).raw_query_string.removeprefix("k="),
    }
    encoded |= {_PERCENT_ESCAPE.sub(lambda m: m.group().lower(), form) for form in encoded}
    forms = set(encoded)
    for form in encoded:
        for escaped in (json.dumps(form, ensure_ascii=False)[1:-1], json.dumps(form)[1:-1]):
            forms.update((escaped, escaped.replace("/", "\\/")))
    return frozenset(forms)


def _json_forms(forms: Iterable[str]) -> set[bytes]:
    """How each text form reads inside orjson's output: orjson escapes only quote, backslash and
    control characters, so a raw form containing one never appears there verbatim."""
    found = set()
    for form in forms:
        try:
            found.add(orjson.dumps(form)[1:-1])
        except orjson.JSONEncodeError:  # a lone surrogate: orjson cannot write it at all
            continue
    return found


def _rules(anchor: AnyStr, forms: Iterable[AnyStr]) -> list[_Rule[AnyStr]]:
    """Group `forms` under `anchor`; a form that lacks it (a secret that is all punctuation)
    is its own anchor."""
    grouped = tuple(sorted((f for f in forms if anchor and anchor in f), key=len, reverse=True))
    rules: list[_Rule[AnyStr]] = [(anchor, grouped)] if grouped else []
    rules.extend((form, (form,)) for form in forms if not (anchor and anchor in form))
    return rules


def _secret_rules(value: str) -> tuple[list[_Rule[str]], list[_Rule[bytes]]]:
    forms = secret_forms(value)
    anchor = max(_UNRESERVED_RUN.findall(value), key=len, default="")
    return _rules(anchor, forms), _rules(anchor.encode(), _json_forms(forms))


def register_secret(value: str | None) -> None:
    """Redact `value`, in every form it travels in, from every log line and every JSON response
    from now on. Short values are ignored: too many false hits. The forms are worked out here,
    once, so redacting a text costs about one substring search per secret."""
    global _TEXT_RULES, _JSON_RULES
    if not value or len(value) < _MIN_SECRET_CHARS:
        return
    with _register_lock:
        if value in _SECRETS:
            return
        _SECRETS.add(value)
        text_rules, json_rules = _secret_rules(value)
        _TEXT_RULES = (*_TEXT_RULES, *text_rules)
        _JSON_RULES = (*_JSON_RULES, *json_rules)


def _redact(text: AnyStr, rules: Iterable[_Rule[AnyStr]], replacement: AnyStr) -> AnyStr:
    hits = [form for anchor, forms in rules if anchor in text for form in forms]
    if len(hits) > 1:  # one secret may contain another: the longer form goes first
        hits.sort(key=len, reverse=True)
    for form in hits:
        if form in text:
            text = text.replace(form, replacement)
    return text


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """Return `text` with every form of every registered (or given) secret replaced by ***."""
    if secrets is None:
        return _redact(text, _TEXT_RULES, _REDACTED)
    rules = [rule for secret in secrets if secret for rule in _secret_rules(secret)[0]]
    return _redact(text, rules, _REDACTED)


def redact_json(body: bytes) -> bytes:
    """Return serialised JSON (orjson's output) with every form of every registered secret
    replaced by ***; the result is still valid JSON, since *** needs no escaping."""
    return _redact(body, _JSON_RULES, _REDACTED_BYTES)


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_fields(event: str, fields: dict[str, object]) -> str:
    """`event key=value ...`, quoting values that contain spaces, quotes or newlines."""
    parts = [event]
    parts.extend(f"{key}={_quote(value)}" for key, value in fields.items() if value is not None)
    return " ".join(parts)


def log_event(
    logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object
) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, format_fields(event, fields))


class RedactingFilter(logging.Filter):
    """Redact a record at its source logger, whatever handler (ours, pytest's, a user's) gets it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def redact_third_party_loggers() -> None:
    """HTTP libraries may log request URLs (SerpAPI's key is in its URL): redact at the source."""
    for name in ("httpx", "httpcore", "aiohttp.client", "aiohttp.internal"):
        target = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in target.filters):
            target.addFilter(RedactingFilter())


class RedactingFormatter(logging.Formatter):
    _second: int | None = None
    _stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """logging's own stamp (`2026-12-01 21:45:59,329`), the part to the second made once a
        second rather than once a line (time.strftime was ~3 % of a logged call's CPU)."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"  # logging's default_msec_format


class BufferedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Lines written in batches: one write for many records instead of one per record.

    A service logs every call, and each line was its own write() and flush() (on gVisor ~70 %
    of the tool server's system-call time, profiled with strace). Lines wait at most
    `interval_s` (a flusher thread, started in the process that logs, so a forked worker gets
    its own); a WARNING or worse, a full buffer and logging's shutdown at exit write at once.
    """

    def __init__(
        self,
        stream: Any,
        interval_s: float = 0.1,
        capacity: int = 512,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._interval_s = interval_s
        self._clock = clock  # the flusher sleeps on it
        self._capacity = capacity
        self._flusher_pid: int | None = None

    def emit(self, record: logging.LogRecord) -> None:  # called with self.lock held
        try:
            self._lines.append(self.format(record))
            if record.levelno >= logging.WARNING or len(self._lines) >= self._capacity:
                self._write()
            elif self._flusher_pid != os.getpid():
                self._start_flusher()
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            try:
                self._write()
            except Exception:  # the stream is gone (closed at exit): nothing left to do
                self._lines.clear()

    def close(self) -> None:
        self.flush()
        self._flusher_pid = None  # the flusher thread ends at its next wake-up
        super().close()

    def _write(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            self.stream.write(self.terminator.join(lines) + self.terminator)
            self.stream.flush()

    def _start_flusher(self) -> None:
        self._flusher_pid = os.getpid()
        threading.Thread(target=self._flush_every_interval, name="log-flush", daemon=True).start()

    def _flush_every_interval(self) -> None:
        pid = os.getpid()
        while self._flusher_pid == pid:
            self._clock.sleep(self._interval_s)
            self.flush()


def flush_logs() -> None:
    """Write out what the handlers hold: before a process ends by a signal (uvicorn re-raises
    SIGTERM after its shutdown), where no exit handler runs."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def configure_logging(level: str | int = "INFO") -> None:
    """Root logging for our processes: timestamped key=value lines on stderr, secrets redacted.

    httpx and httpcore log every request URL at INFO; SerpAPI carries its key in the URL, so both
    are held at WARNING (bm25s too: it logs at DEBUG whatever the root level).
    """
    handler = BufferedStreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    # The format names none of the caller's file and line, thread or process: do not compute
    # them for every record (the logging HOWTO's "Optimization"; a service logs every call).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
