"""cluster.json: node 0's bootstrap writes it (slurm.cluster_note.write_cluster) and the
trainers read it back (read_cluster) with each tool server's workers as a JSON list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.base.errors import RuntimeFailure
from slurm.cluster_note import (
    ClusterNode,
    ClusterNote,
    node_from_ready,
    read_cluster,
    write_cluster,
)

NOTE = ClusterNote(
    "7-0",
    "10.0.0.1:6379",
    (
        ClusterNode(
            0,
            "deepdive_node_0",
            ("http://10.0.0.1:20010", "http://10.0.0.1:20011"),
            "http://10.0.0.1:20020",
            ("http://10.0.0.1:20030",),
        ),
        ClusterNode(1, "deepdive_node_1", ("http://10.0.0.2:20010",), "http://10.0.0.2:20020"),
    ),
)


def test_a_written_note_reads_back_with_every_nodes_workers_as_lists(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    write_cluster(path, NOTE)
    on_disk = json.loads(path.read_text())
    assert on_disk["nodes"][0]["tools"] == ["http://10.0.0.1:20010", "http://10.0.0.1:20011"]
    assert on_disk["nodes"][0]["tools_unseen"] == ["http://10.0.0.1:20030"]
    assert on_disk["nodes"][1]["tools_unseen"] is None
    assert read_cluster(path) == NOTE
    assert NOTE.tool_nodes == (
        ("http://10.0.0.1:20010", "http://10.0.0.1:20011"),
        ("http://10.0.0.2:20010",),
    )
    assert NOTE.reward_urls == ("http://10.0.0.1:20020", "http://10.0.0.2:20020")


def test_node_0_writes_the_ready_notes_workers_as_they_were(tmp_path: Path) -> None:
    """What bootstrap._join does: each node's ready note (each service's workers' URLs, a
    list) becomes its entry; nothing is joined or split on the way."""
    ready = [
        {"tools": list(NOTE.nodes[0].tools), "reward": [NOTE.nodes[0].reward],
         "tools-unseen": ["http://10.0.0.1:20030"]},
        {"tools": list(NOTE.nodes[1].tools), "reward": [NOTE.nodes[1].reward]},
    ]  # fmt: skip
    nodes = tuple(node_from_ready(node, services) for node, services in enumerate(ready))
    path = tmp_path / "cluster.json"
    write_cluster(path, ClusterNote("7-0", "10.0.0.1:6379", nodes))
    assert read_cluster(path) == NOTE


def test_no_note_yet_is_none(tmp_path: Path) -> None:
    assert read_cluster(tmp_path / "cluster.json") is None


@pytest.mark.parametrize(
    "tools",
    ["http://10.0.0.1:20010,http://10.0.0.1:20011", [], [3]],  # the old joined string too
)
def test_a_node_whose_tools_are_not_a_list_of_urls_is_named(tmp_path: Path, tools: object) -> None:
    path = tmp_path / "cluster.json"
    write_cluster(path, NOTE)
    note = json.loads(path.read_text())
    note["nodes"][1]["tools"] = tools
    path.write_text(json.dumps(note))
    with pytest.raises(
        RuntimeFailure, match=r"cluster.json: node entry 1 lacks its .*tools \(a list"
    ):
        read_cluster(path)


def test_a_reward_server_of_other_than_one_url_is_named() -> None:
    services = {"tools": ["http://10.0.0.1:20010"], "reward": ["http://a:1", "http://a:2"]}
    with pytest.raises(RuntimeFailure, match=r"node 1's reward server announced .* not one URL"):
        node_from_ready(1, services)
