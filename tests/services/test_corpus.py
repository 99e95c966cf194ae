from pathlib import Path

import pytest

from services.base.errors import ConfigError
from services.tool_server.corpus import (
    CorpusIndex,
    corpus_fingerprint,
    load_corpus,
    read_jsonl_corpus,
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"url": "u", "title": "t", "text": "x"}\nnot json\n', "line 2: not valid JSON"),
        ('["a"]\n', "line 1: expected a JSON object"),
        ('{"url": "u", "title": "t"}\n', "line 1, field 'text'"),
        ('{"url": "", "title": "t", "text": "x"}\n', "line 1, field 'url'"),
        ('{"url": "u", "title": 3, "text": "x"}\n', "line 1, field 'title'"),
        ("\n\n", "no documents"),
    ],
)
def test_bad_corpus_rows_name_file_line_and_field(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_jsonl_corpus(path)


def test_index_is_built_once_and_reused(corpus_file: Path, tmp_path: Path) -> None:
    documents = load_corpus(corpus_file)
    cache = tmp_path / "cache"
    first = CorpusIndex.open(documents, cache, show_progress=False)
    folders = list(cache.iterdir())
    assert [f.name for f in folders] == [corpus_fingerprint(documents)]
    stamp = (folders[0] / "params.index.json").stat().st_mtime_ns
    second = CorpusIndex.open(documents, cache, show_progress=False)
    assert (folders[0] / "params.index.json").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    query = "silver orrery clockmaker"
    assert [d.url for d in first.search(query, 3)] == [d.url for d in second.search(query, 3)]
    assert first.search(query, 3)[0].url == "https://wiki.example/Orrery_of_Haldor"
    assert first.search("zzzz qqqq", 3) == []
    assert first.search("the of and", 3) == []  # stopwords only


def test_a_corrupt_cached_index_is_rebuilt(corpus_file: Path, tmp_path: Path) -> None:
    documents = load_corpus(corpus_file)
    cache = tmp_path / "cache"
    CorpusIndex.open(documents, cache, show_progress=False)
    target = cache / corpus_fingerprint(documents)
    (target / "params.index.json").write_text("{broken")
    index = CorpusIndex.open(documents, cache, show_progress=False)
    assert index.search("orrery", 1)[0].title == "Orrery of Haldor"


def test_default_wikipedia_corpus_is_available() -> None:
    documents = load_corpus(None)
    assert len(documents) > 9_000
    by_title = {d.title: d for d in documents}
    assert by_title["Ada Lovelace"].url == "https://en.wikipedia.org/wiki/Ada_Lovelace"
    assert "mathematician" in by_title["Ada Lovelace"].text


def test_a_corpus_without_searchable_words_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"url": "https://a/", "title": "", "text": "a b c the of"}\n')
    with pytest.raises(ConfigError, match="no searchable words"):
        CorpusIndex.open(read_jsonl_corpus(path), None, show_progress=False)
