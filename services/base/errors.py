"""Every error of deepdive-slurm, in one tree, so callers know what to catch; the commands
turn a ConfigError into exit code 2 and every other DeepDiveError into exit code 1, with one
line and no traceback (services/base/cli.py run_handler).

Classes defined beside the code that raises them name their module; tests/test_error_tree.py
checks that this drawing is exactly the tree the code defines.

DeepDiveError
├── ConfigError                 bad input the user must fix: a config value, an option, a file
│   │                           the command names (found before anything starts)
│   └── ConversionError         a QA file `deepdive convert` cannot convert (deepdive/convert/rows.py)
├── ItemFailed                  a bug of ours met while evaluating one item: that item scores 0,
│                               its batch keeps the others' rewards, the bug is logged
├── ServingError                what a request to the HTTP services, or a call they make, ends in
│   ├── RequestError            the *client* sent something malformed  -> HTTP 4xx
│   │   ├── InvalidJSON         the body is not JSON  -> HTTP 400
│   │   ├── PayloadTooLarge     the body is over the configured limit  -> HTTP 413
│   │   └── ClientDisconnected  the client left before its body was complete (services/web.py)
│   ├── PlainHttpError          a plain http:// hop failed: Upstream retries (services/client/plain_http.py)
│   ├── ResponseTooLarge        a plain http:// reply passed the byte cap (services/client/plain_http.py)
│   └── ToolError               a tool call failed in a way the *model* should read -> HTTP 200
│       ├── InvalidArguments    arguments of the wrong shape or type
│       ├── UnknownTool         a tool name the server does not offer
│       ├── InvalidLinkId       click without a matching result in the session's latest search
│       ├── SessionLost         click in a session whose results died with a restarted worker
│       ├── PageNotFound        the offline corpus has no page at that URL
│       ├── PageUnavailable     a bot challenge, an empty or unreadable page
│       ├── ContentBlocked      the leakage filter or the domain blocklist refused the page
│       ├── URLRejected         the URL guard refused the URL (scheme, private address, ...)
│       ├── DeadlineExceeded    the tool call ran past its total deadline
│       ├── ProtocolError       a call that breaks the tool-call syntax (deepdive/protocol.py)
│       └── UpstreamError       a search/reader provider, the judge or SGLang failed
│           ├── UpstreamAuthError       401/402/403: a key missing, wrong or out of credit
│           ├── UpstreamRateLimited     429 after every retry
│           ├── UpstreamUnavailable     5xx or transport errors after every retry
│           └── UpstreamBadResponse     malformed JSON, an API error on HTTP 200, a challenge
│               └── MismatchedReply     a reply to another request (services/client/http.py)
└── RuntimeFailure              a fact of the world, not the user's input: a command, a process,
    │                           a node or a wait failed
    ├── SchedulerError          a Slurm command is missing or failed (slurm/launch/scheduler.py)
    │   └── SubmissionRefused   sbatch refused the job (slurm/launch/submit.py)
    ├── WaitTimeout             the awaited thing did not happen in time (services/base/waiting.py)
    │   └── NoAnswer            a node left no note for a smoke step (slurm/smoke/context.py)
    ├── ServiceStartError       a service exited or never became ready (services/base/process.py)
    ├── WorkerExited            a server's worker ended while serving (services/serving/workers.py)
    ├── WorkerStartError        a rollout worker did not start (deepdive/local/ray_rollouts.py)
    ├── RayStartError           Ray's head or a worker did not start (slurm/node/ray_cluster.py)
    ├── SGLangStartError        SGLang did not start (slurm/backends/slime/sglang_server.py)
    ├── ConversionFailed        a checkpoint conversion failed (slurm/backends/slime/conversion.py)
    ├── NodeFailed              a node could not do its part (slurm/node/phases.py)
    ├── EgressFailed            a node cannot reach an upstream (slurm/node/egress.py)
    ├── SmokeFailed             a GPU smoke job failed or left no report (slurm/smoke/job.py)
    ├── NoDriver                nvidia-smi is missing or cannot reach the driver (slurm/smoke/gpus.py)
    ├── Unavailable             SGLang failed a smoke step's request (slurm/smoke/sglang_step.py)
    ├── LabelsUnreadable        an image's labels could not be read (slurm/launch/image_labels.py)
    ├── PortsUnavailable        no free span of ports on a node (slurm/node/ports.py)
    ├── RolloutAborted          too many of a rollout's episodes aborted (deepdive/aborts.py)
    ├── ToolsFailing            too many of a rollout's tool calls failed (deepdive/tool_errors.py)
    ├── NoBaseline              a benchmark's baseline tree cannot be made (benchmarks/baseline.py)
    ├── MissingTool             a benchmark needs a program this machine lacks (benchmarks/harness.py)
    └── _Unloadable             a checkpoint folder is corrupt (deepdive/local/checkpoint.py)
"""

from __future__ import annotations


class DeepDiveError(Exception):
    """Base of every error the project raises on purpose; `message` is one line for a person."""

    code = "deepdive_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(DeepDiveError):
    """Bad input the user must fix (a config value, an option, a file the command names): the
    message says which and what was expected. Exit code 2."""

    code = "config_error"


class ItemFailed(DeepDiveError):
    """One item of a batch hit a bug of ours; it scores 0 and the others keep their results."""

    code = "internal_error"


class ServingError(DeepDiveError):
    """A request to the HTTP services, or a call they or the rollout make, failed; `code` is
    machine-readable and travels in the answer."""

    code = "serving_error"


class RequestError(ServingError):
    """The request itself is malformed. Answered with a 4xx and a message naming the field."""

    code = "invalid_request"
    status_code = 422


class InvalidJSON(RequestError):
    code = "invalid_json"
    status_code = 400


class PayloadTooLarge(RequestError):
    code = "payload_too_large"
    status_code = 413


class ToolError(ServingError):
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


class RuntimeFailure(DeepDiveError):
    """A fact of the world, not the user's input: a command, a process, a node or a wait failed.
    Exit code 1; the message names what failed and, where it can, where to look."""

    code = "runtime_failure"
