"""An episode as the generate hook (deepdive.generate) grows it, turn by turn.

`Trajectory` holds the tokens, loss mask and log-probabilities slime trains on; `RolloutStats`
what the episode did (turns, tool calls, tool errors, timings), kept in
sample.metadata["deepdive"] for deepdive.agent_stats and deepdive.trajectory_recorder; `Turn`
is one model turn as SGLang returned it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deepdive.messages import one_line
from deepdive.protocol import ToolReply
from deepdive.tool_errors import TOOL_ERROR_CHARS
from deepdive.top_p import TopPSpans


@dataclass
class Trajectory:
    """The growing episode. `tokens` is prompt + response, one running list (sent as it is to
    /generate every turn, never rebuilt); the response's loss mask and log-probs stay as long as
    the response, always."""

    tokens: list[int]
    prompt_length: int = 0
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    top_p: TopPSpans | None = None  # with --rollout-top-p < 1 (deepdive.top_p)

    @classmethod
    def from_prompt(cls, prompt_ids: list[int]) -> Trajectory:
        return cls(tokens=list(prompt_ids), prompt_length=len(prompt_ids))

    def add_model_turn(self, turn: Turn) -> None:
        self.tokens += turn.ids
        self.mask += [1] * len(turn.ids)
        self.logprobs += turn.logprobs
        self.parts.append(turn.text)
        if self.top_p is not None and turn.top_p is not None:
            self.top_p.add_turn(*turn.top_p)

    def add_observation(self, ids: Sequence[int], text: str) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.parts.append(text)
        if self.top_p is not None:
            self.top_p.add_empty(len(ids))

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def length(self) -> int:
        return len(self.tokens)


_TOOL_ERROR_WORDS = 3  # distinct messages kept per episode: what the tools said, not a log


@dataclass
class RolloutStats:
    """An episode's statistics, kept in sample.metadata["deepdive"]. `tool_errors` counts the
    tool calls that failed, by kind (deepdive.protocol.TOOL_ERROR_KINDS; the model's own
    mistakes are none), and `tool_error_words` what the tools said, by message."""

    turns: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    generation_s: float = 0.0
    tool_s: float = 0.0
    error: str | None = None
    tool_errors: Counter[str] = field(default_factory=Counter)
    tool_error_words: Counter[str] = field(default_factory=Counter)
    # per model turn, where its text and its observation lie in sample.response and what the
    # call was (deepdive.trajectory_recorder reads it): a few small fields, not the texts
    turn_log: list[dict[str, Any]] = field(default_factory=list)

    def count_tool_error(self, reply: ToolReply) -> None:
        kind = reply.error_kind
        if kind is None or reply.error is None:
            return
        self.tool_errors[kind] += 1
        said = one_line(reply.error.message, TOOL_ERROR_CHARS)
        if said in self.tool_error_words or len(self.tool_error_words) < _TOOL_ERROR_WORDS:
            self.tool_error_words[said] += 1

    def as_dict(self, evaluation: bool) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "tool_calls": dict(self.tool_calls),
            "tool_errors": dict(self.tool_errors),
            "tool_error_words": dict(self.tool_error_words),
            "error": self.error,
            "generation_s": round(self.generation_s, 4),
            "tool_s": round(self.tool_s, 4),
            "evaluation": evaluation,
            "turn_log": self.turn_log,
        }


@dataclass(frozen=True)
class Turn:
    """One model turn as SGLang's /generate returned it (deepdive.generate.generate_turn)."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    top_p: tuple[list[int], list[int]] | None = None  # kept ids and offsets, when asked for
    abort: str | None = None  # why SGLang aborted the turn, in its words (deepdive.aborts)
