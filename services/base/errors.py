"""Every error the services raise, in one tree, so callers know what to catch.

ServiceError
├── ConfigError                 bad configuration, found at start-up (never at request time)
├── ItemFailed                  a bug of ours met while evaluating one item: that item scores 0,
│                               its batch keeps the others' rewards, the bug is logged
├── RequestError                the *client* sent something malformed  -> HTTP 4xx
│   └── PayloadTooLarge         the body is over the configured limit  -> HTTP 413
└── ToolError                   a tool call failed in a way the *model* should read -> HTTP 200 + "error"
    ├── InvalidArguments        arguments of the wrong shape or type
    ├── UnknownTool             a tool name the server does not offer
    ├── InvalidLinkId           click without a matching result in the session's latest search
    ├── SessionLost             click in a session whose results died with a restarted worker
    ├── PageNotFound            the offline corpus has no page at that URL
    ├── PageUnavailable         the site answered with a bot challenge, an empty or unreadable page
    ├── ContentBlocked          the leakage filter or the domain blocklist refused the page
    ├── URLRejected             the URL guard refused the URL (scheme, private address, ...)
    ├── DeadlineExceeded        the tool call ran past its total deadline
    └── UpstreamError           a search/reader provider failed
        ├── UpstreamAuthError       401/402/403: a key is missing, wrong or out of credit (not retried)
        ├── UpstreamRateLimited     429 after every retry
        ├── UpstreamUnavailable     5xx or transport errors after every retry
        └── UpstreamBadResponse     malformed JSON, an API error on HTTP 200, a challenge page
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error raised by the services."""

    code = "service_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ServiceError):
    """A configuration value is invalid; raised before any server starts."""

    code = "config_error"


class ItemFailed(ServiceError):
    """One item of a batch hit a bug of ours; it scores 0 and the others keep their results."""

    code = "internal_error"


class RequestError(ServiceError):
    """The request itself is malformed. Answered with a 4xx and a message naming the field."""

    code = "invalid_request"
    status_code = 422


class InvalidJSON(RequestError):
    code = "invalid_json"
    status_code = 400


class PayloadTooLarge(RequestError):
    code = "payload_too_large"
    status_code = 413


class ToolError(ServiceError):
    """A failed tool call. The model reads `message` as the observation; `code` is machine-readable."""

    code = "tool_error"


class InvalidArguments(ToolError):
    code = "invalid_arguments"


class UnknownTool(ToolError):
    code = "unknown_tool"


class InvalidLinkId(ToolError):
    code = "invalid_link_id"


class SessionLost(ToolError):
    """The session's state (its latest results) was held by a tool server worker that died
    and was restarted: the model must search again, nothing it did was wrong."""

    code = "session_lost"


class PageNotFound(ToolError):
    code = "page_not_found"


class PageUnavailable(ToolError):
    code = "page_unavailable"


class ContentBlocked(ToolError):
    code = "content_blocked"


class URLRejected(ToolError):
    code = "url_rejected"


class DeadlineExceeded(ToolError):
    code = "deadline_exceeded"


class UpstreamError(ToolError):
    """A provider failed. `upstream` names it (serper, serpapi, jina, direct, judge, ...)."""

    code = "upstream_error"

    def __init__(self, upstream: str, message: str) -> None:
        super().__init__(f"{upstream}: {message}")
        self.upstream = upstream


class UpstreamAuthError(UpstreamError):
    code = "upstream_auth"


class UpstreamRateLimited(UpstreamError):
    code = "upstream_rate_limited"


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"


class UpstreamBadResponse(UpstreamError):
    code = "upstream_bad_response"
