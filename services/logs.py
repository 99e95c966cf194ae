"""One line per event, key=value, with every known secret redacted before it is written.

Why a redacting filter: a secret can reach a log through a third-party message (an exception that
quotes a URL with `api_key=` in it), not only through our own calls. The filter is the last line
of defence; our own code never logs request bodies, headers or upstream URLs in the first place.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

_SECRETS: set[str] = set()
_REDACTED = "***"


def register_secret(value: str | None) -> None:
    """Redact `value` from every log line from now on (short values are ignored: too many false hits)."""
    if value and len(value) >= 6:
        _SECRETS.add(value)


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """Return `text` with every registered (or given) secret replaced by ***."""
    for secret in _SECRETS if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, _REDACTED)
    return text


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
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(level: str | int = "INFO") -> None:
    """Root logging for our processes: timestamped key=value lines on stderr, secrets redacted.

    httpx and httpcore log every request URL at INFO; SerpAPI carries its key in the URL, so both
    are held at WARNING (bm25s too: it logs at DEBUG whatever the root level).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
