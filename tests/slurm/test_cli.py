"""`deepdive` as a user runs it: a real process, real ports, keys only in the environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from pytest_httpserver import HTTPServer

from tests.helpers import DEEPDIVE

SECRET = "serper-cli-secret-0123456789"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEEPDIVE, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args", [[], ["serve"], ["serve", "tools"], ["serve", "reward"]])
def test_every_command_has_help(args: list[str]) -> None:
    result = run(*args, "--help")
    assert result.returncode == 0
    assert "usage: deepdive" in result.stdout


HEAVY: tuple[str, ...] = ("torch", "ray", "starlette", "uvicorn", "aiohttp", "submitit")
HEAVY += ("transformers", "httpx", "services.tool_server", "services.reward_server")
HEAVY += ("services.client.http",)
LOADED = """
import contextlib, io, sys
from slurm.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print("\\n".join(sorted(sys.modules)))
"""


def modules_loaded(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", LOADED, *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize(
    ("args", "most", "unloaded"),
    [
        (["--help"], 150, ("deepdive", "slurm.launch.command", "slurm.config")),
        (["status", "--help"], 250, ()),
        (["logs", "--help"], 250, ()),
        (["trajectories", "--help"], 250, ()),
    ],
)
def test_a_commands_help_loads_only_that_command(
    args: list[str], most: int, unloaded: tuple[str, ...]
) -> None:
    """`deepdive status --help` loaded every server, Ray's and torch's tables: 757 modules,
    2.4-2.6 s on a loaded machine, 0.86 s idle (0.11 s now, 171 modules)."""
    loaded = modules_loaded(*args)
    heavy = [name for name in loaded if name.split(".")[0] in HEAVY or name.startswith(HEAVY)]
    assert not heavy, heavy
    if unloaded:
        assert not [name for name in loaded if name.startswith(unloaded)]
    assert len(loaded) < most, len(loaded)


def test_serve_tools_help_documents_providers_and_keys() -> None:
    out = run("serve", "tools", "--help").stdout
    for word in (
        "--search",
        "offline",
        "serper",
        "serpapi",
        "--reader",
        "jina",
        "direct",
        "SERPER_API_KEY",
    ):
        assert word in out
    assert "--api-key" not in out  # keys never on the command line


def test_exposing_without_a_token_is_refused(corpus_file: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DEEPDIVE_SERVICE_TOKEN"}
    # TEST-NET-2, on no interface here: refused before anything is bound
    result = run("serve", "tools", "--host", "198.51.100.1", "--corpus", str(corpus_file), env=env)
    assert result.returncode == 2
    assert "DEEPDIVE_SERVICE_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_env_file_readable_by_others_is_refused(tmp_path: Path, corpus_file: Path) -> None:
    env_file = tmp_path / "keys.env"
    env_file.write_text(f"SERPER_API_KEY={SECRET}\n")
    env_file.chmod(0o644)
    result = run("serve", "tools", "--env-file", str(env_file), "--corpus", str(corpus_file))
    assert result.returncode == 2
    assert "chmod 600" in result.stderr and SECRET not in result.stderr


def test_a_bad_corpus_line_is_named(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(
        '{"url": "https://a/", "title": "A", "text": "a"}\n{"title": "B", "text": "b"}\n'
    )
    result = run(
        "serve", "tools", "--corpus", str(corpus), "--index-cache-dir", "false", "--port", "0"
    )
    assert result.returncode == 2
    assert f"corpus {corpus}, line 2, field 'url': expected a non-empty string" in result.stderr
    assert "Traceback" not in result.stderr


@contextmanager
def server_process(
    args: list[str], env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [*DEEPDIVE, "serve", "tools", "--port", "0", "--workers", "1", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        base = None
        while base is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                raise AssertionError(f"server exited with {process.returncode}")
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                base = match.group(1)
        assert base is not None
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        yield process, base
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_serve_tools_end_to_end_keeps_keys_out_of_argv_and_logs(
    httpserver: HTTPServer, corpus_file: Path, tmp_path: Path
) -> None:
    httpserver.expect_request("/search", headers={"X-API-KEY": SECRET}).respond_with_json(
        {
            "searchParameters": {"q": "orrery"},
            "organic": [{"title": "Orrery", "link": "https://o.example/", "snippet": "a model"}],
        }
    )
    env = {**os.environ, "SERPER_API_KEY": SECRET}
    env.pop("DEEPDIVE_SERVICE_TOKEN", None)
    args = [
        "--search",
        "serper",
        "--serper.base-url",
        httpserver.url_for(""),
        "--corpus",
        str(corpus_file),
        "--index-cache-dir",
        str(tmp_path / "idx"),
    ]
    with server_process(args, env) as (process, base):
        response = httpx.post(
            f"{base}/tool",
            json={"session_id": "s", "name": "search", "arguments": {"query": "orrery"}},
        )
        assert response.json()["output"] == "【1】Orrery\nhttps://o.example/\na model"
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
        assert SECRET not in cmdline
        assert httpx.get(f"{base}/ready").json()["search"] == "serper"
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert SECRET not in stderr
    assert "tool_call session=s tool=search" in stderr
    assert "orrery" not in stderr.split("tool_call", 1)[1]  # the query itself is not logged
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells why it ended
    assert process.returncode in (0, -15)
    assert "Application shutdown complete" in stderr


def test_serve_reward_help_documents_judges_and_slime_flags() -> None:
    out = run("serve", "reward", "--help").stdout
    for word in (
        "--judge",
        "rule",
        "openai",
        "--judge-upstream.base-url",
        "OPENAI_API_KEY",
        "--reward-key reward",
    ):
        assert word in out
