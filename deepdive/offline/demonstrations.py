"""Demonstration trajectories for a short supervised warm start (DeepDive also starts RL from SFT).

Each demonstration is what a competent agent would do for one world question: search for the
start entity by its description, click it, then search and click each entity along the walk
whose page holds the next fact, and finish with the answer. When the answer is an entity, its
name is already on the page before it, so its own page is not opened: one search and one click
per hop, the fewest calls that read every fact the answer rests on (and the shortest sequences
for the warm start and the rollouts). Observations are produced by the tool server's own
offline search, result formatting and page formatting, so they are exactly what the rollout
will see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from deepdive.offline.world import Question, World, describe, name_words
from deepdive.protocol import (
    FINISH,
    PAGE_CHARS,
    SYSTEM_PROMPT,
    format_observation,
    format_page,
    format_results,
    format_tool_call,
    split_pages,
)
from services.tool_server.corpus import CorpusIndex, Document
from services.tool_server.models import Page, SearchResult
from services.tool_server.offline import snippet_of

RESULTS_PER_SEARCH = 3
_CAPITALISED = re.compile(r"[A-Z][a-z]+")


@dataclass(frozen=True)
class Segment:
    role: str  # "model" (trained on) or "observation" (masked out)
    text: str


class Demonstrator:
    def __init__(self, world: World, index: CorpusIndex) -> None:
        self.world = world
        self.index = index
        self.words = {word for name in world.entities for word in name_words(name)}

    def names_in(self, segments: list[Segment]) -> list[str]:
        """The world's name words a trajectory mentions (the warm start can rename them)."""
        text = "".join(segment.text for segment in segments)
        return sorted(set(_CAPITALISED.findall(text)) & self.words)

    def _search(self, query: str) -> tuple[str, list[Document]]:
        found = self.index.search(query, RESULTS_PER_SEARCH)
        results = [SearchResult(d.title, d.url, snippet_of(d.text)) for d in found]
        return format_results(results), found

    def _page(self, doc: Document) -> str:
        page = Page(doc.url, doc.title, doc.text)
        return format_page(page, split_pages(page.text, PAGE_CHARS), 1)

    def demonstrate(self, question: Question) -> list[Segment] | None:
        """The segments of one trajectory, or None when search cannot reach a step (skipped)."""
        segments: list[Segment] = []
        answer_is_an_entity = question.answer == question.path[-1]
        to_open = question.path[:-1] if answer_is_an_entity else question.path
        for step, name in enumerate(to_open):
            entity = self.world.entities[name]
            query = describe(entity) if step == 0 else name
            thought = f"I need to find {query}." if step == 0 else f"Next I look up {name}."
            observation, found = self._search(query)
            call = format_tool_call("search", {"query": query, "num": RESULTS_PER_SEARCH})
            segments.append(Segment("model", f"{thought}\n{call}"))
            segments.append(Segment("observation", format_observation(observation)))
            rank = next((i for i, doc in enumerate(found, start=1) if doc.title == name), None)
            if rank is None:
                return None
            segments.append(Segment("model", format_tool_call("click", {"link_id": rank})))
            segments.append(Segment("observation", format_observation(self._page(found[rank - 1]))))
        final = f"The answer is {question.answer}.\n" + format_tool_call(
            FINISH, {"answer": question.answer}
        )
        segments.append(Segment("model", final))
        return segments


def demonstration_row(
    question: Question, segments: list[Segment], names: list[str]
) -> dict[str, Any]:
    """`names`: the name words the trajectory mentions, for deepdive.local.warm_start.renamed."""
    return {
        "id": question.id,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question.question},
        ],
        "segments": [{"role": s.role, "text": s.text} for s in segments],
        "response": "".join(s.text for s in segments),
        "answer": question.answer,
        "names": names,
    }
