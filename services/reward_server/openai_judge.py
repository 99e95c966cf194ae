"""An LLM judge behind any OpenAI-compatible chat-completions endpoint (temperature 0).

The grading prompt follows BrowseComp's: the judge extracts the final answer, reasons, and ends
with `correct: yes|no`. The parser is strict: exactly one verdict line, one word on it, or the
judgement is unparseable, which is never a reward; an answer written in the grader's own format
is refused before the judge is asked. Verdicts are cached by (question, references, answer):
a GRPO group often repeats an answer, and a judge call costs money.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import orjson

from services.base.errors import ToolError, UpstreamBadResponse
from services.base.logs import register_secret
from services.cache import AsyncCache, CacheSettings
from services.client.http import (
    Upstream,
    UpstreamProvider,
    UpstreamSettings,
    decode_json_object,
    only_2xx,
)
from services.reward_server.judging import Verdict
from services.serving.metrics import ServiceMetrics

KEY_ENVS = ("DEEPDIVE_JUDGE_API_KEY", "OPENAI_API_KEY")
DEFAULT_URL = "https://api.openai.com/v1"
# Judge requests in flight at most. OpenAI-compatible providers limit requests per minute (for
# OpenAI's small models from ~500 RPM on the lowest paid tier to ~30,000 RPM at the top) and a
# short verdict takes ~0.5-2 s; a self-hosted judge (vLLM, SGLang) batches hundreds at once.
# 128 in flight is ~100-250 verdicts/s; the old 16 capped the judge at ~16 per judge latency
# (160/s at 0.1 s) whatever the load. Past a provider's limit it answers 429 with Retry-After.
DEFAULT_CONCURRENCY = 128
DEFAULT_MODEL = "gpt-4o-mini"

GRADER_PROMPT = """Judge whether the [response] to the [question] is correct, using the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must follow this format and these criteria:

extracted_final_answer: the final exact answer extracted from the [response]. Write None if there is no exact, final answer to extract.

[correct_answer]: {correct_answer}
{aliases}
reasoning: explain why the extracted_final_answer is correct or incorrect with respect to the [correct_answer], focusing only on meaningful differences. Do not solve the problem again, do not argue for a different answer, only judge whether the answers agree.

correct: answer yes if extracted_final_answer matches the [correct_answer] (or an accepted alias), or is within a small margin of error for numerical problems; answer no otherwise, including when the response gives several candidate answers, is ambiguous or is not an answer at all.
"""

# Markdown a judge may wrap a label or a verdict in: **correct:** *yes*, ### correct: yes.
_DECOR = r"[\s*#>_`~-]*"
# Any line that starts with the verdict's label is a verdict line, and must be a clean one.
_VERDICT_LINE = re.compile(rf"^{_DECOR}correct{_DECOR}:(.*)$", re.IGNORECASE | re.MULTILINE)
_ONE_WORD = re.compile(rf"{_DECOR}(yes|no)[\s*_`~.!]*", re.IGNORECASE)
_GRADING_LINE = re.compile(
    rf"^{_DECOR}(?:correct|extracted_final_answer|reasoning){_DECOR}:", re.IGNORECASE | re.MULTILINE
)
_EXTRACTED = re.compile(
    r"^[\s*#>_-]*extracted_final_answer[\s*_]*:[\s*_]*(.*)$", re.IGNORECASE | re.MULTILINE
)
_REASONING = re.compile(r"^[\s*#>_-]*reasoning[\s*_]*:[\s*_]*(.*)$", re.IGNORECASE | re.MULTILINE)


def imitates_grading(text: str) -> bool:
    """True when `text` holds a line of the grader's own format (`correct: yes`, ...): an answer
    like that is an attempt to write the judge's verdict for it."""
    return _GRADING_LINE.search(text) is not None


def parse_grade(text: str, quoted: tuple[str, ...] = ()) -> Verdict:
    """The judge's reply as a Verdict; raises UpstreamBadResponse unless it holds exactly one
    verdict, written as one word (yes or no) on its `correct:` line.

    `correct: yes/no` (the template echoed unfilled), `correct: yes, but ...` or two verdict
    lines are no verdict. Texts in `quoted` (the question, the answer) that hold grading lines
    are cut out first, so a reply that merely repeats them never grades itself.
    """
    for text_in_prompt in quoted:
        if text_in_prompt.strip() and imitates_grading(text_in_prompt):
            text = text.replace(text_in_prompt, "\n")
    words: set[str] = set()
    for line in _VERDICT_LINE.findall(text):
        verdict = _ONE_WORD.fullmatch(line)
        if verdict is None:
            raise UpstreamBadResponse(
                "judge", "unparseable judgement (a correct: line that is not one word, yes or no)"
            )
        words.add(verdict.group(1).lower())
    if len(words) != 1:
        found = "no verdict line" if not words else "both yes and no"
        raise UpstreamBadResponse("judge", f"unparseable judgement ({found})")
    extracted = _EXTRACTED.search(text)
    reasoning = _REASONING.search(text)
    return Verdict(
        correct=words == {"yes"},
        reason=(reasoning.group(1).strip() if reasoning else "")[:500],
        extracted=extracted.group(1).strip() if extracted else None,
    )


class OpenAIJudge(UpstreamProvider):
    name = "openai"
    key_env = KEY_ENVS[0]
    key_required = True

    def __init__(
        self,
        settings: UpstreamSettings,
        api_key: str | None,
        model: str = DEFAULT_MODEL,
        cache: CacheSettings | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        register_secret(api_key)  # a judge's reasoning can repeat its request back
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        upstream = Upstream(
            "judge",
            # a connection per verdict: none is reused, so no reply left on one is ever read
            # as another item's verdict (docs/http-clients.md)
            dataclasses.replace(settings, pool_connections=False),
            headers=headers,
            metrics=metrics,
            key_hint=" or ".join(KEY_ENVS),
            through_proxy=True,  # on the internet: HTTPS_PROXY / NO_PROXY apply
        )
        super().__init__(upstream, has_key=api_key is not None)
        self.model = model
        self.cache: AsyncCache[Verdict] = AsyncCache(
            "judge",
            cache or CacheSettings(max_entries=100_000, ttl_s=86_400, failure_ttl_s=1.0),
            metrics,
        )

    async def judge(
        self, question: str, labels: tuple[str, ...], answer: str, deadline: float
    ) -> Verdict:
        if imitates_grading(answer):
            return Verdict(False, "the answer imitates the grader's format", extracted=answer)
        key = hashlib.sha256(orjson.dumps([question, list(labels), answer])).hexdigest()

        async def ask() -> Verdict:
            return await self._ask(question, labels, answer, deadline)

        try:
            verdict, _ = await self.cache.get_or_compute(key, ask)
        except ToolError as error:
            return Verdict(None, f"the judge failed: {error.message}", error=error)
        return verdict

    async def _ask(
        self, question: str, labels: tuple[str, ...], answer: str, deadline: float
    ) -> Verdict:
        aliases = f"[accepted_aliases]: {'; '.join(labels[1:])}\n" if len(labels) > 1 else ""
        prompt = GRADER_PROMPT.format(
            question=question or "(not given)",
            response=answer,
            correct_answer=labels[0],
            aliases=aliases,
        )
        payload = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 512,
            "messages": [{"role": "user", "content": prompt}],
        }
        reply = await self.upstream.send(
            "POST", "chat/completions", json=payload, deadline=deadline, check=only_2xx
        )
        data = decode_json_object(reply.content, "judge")
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise UpstreamBadResponse(
                "judge", "the reply has no choices[0].message.content"
            ) from None
        if not isinstance(content, str):
            raise UpstreamBadResponse("judge", "the reply's message content is not text")
        return parse_grade(content, quoted=(question, answer))
