"""`deepdive eval` starts the services with what training's nodes give them: the env file's
search keys and service token (`services.env_file`). Without them the recipe's tool server
(Serper) never becomes ready, and a token in the file would go unsent by the rollout."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from services.base.secrets import TOKEN_ENV
from slurm.launch.evaluate import services
from tests.helpers import slime_recipe as recipe

KEYS = {
    "SERPER_API_KEY": "serper-key-for-the-eval-test",
    "JINA_API_KEY": "jina-key-for-the-eval-test",
    TOKEN_ENV: "token-for-the-eval-test-0123456789",
}


def test_eval_gives_the_services_the_env_files_keys(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in KEYS:  # only the env file may supply them
        monkeypatch.delenv(name, raising=False)
    keys = tmp_path / "eval.env"
    keys.write_text("".join(f"{name}={value}\n" for name, value in KEYS.items()))
    keys.chmod(0o600)
    config = recipe(world, f'services.env_file="{keys}"')  # Serper search, Jina reader
    logs = tmp_path / "logs"
    with services(config, logs) as urls:
        tools = urls["tools"][0]
        bearer = {"Authorization": f"Bearer {KEYS[TOKEN_ENV]}"}
        ready = httpx.get(f"{tools}/ready", headers=bearer, trust_env=False)
        assert ready.status_code == 200 and ready.json()["status"] == "ready"  # Serper's key
        assert httpx.get(f"{tools}/ready", trust_env=False).status_code == 401  # the token
        assert os.environ[TOKEN_ENV] == KEYS[TOKEN_ENV]  # the rollout here sends it
    assert TOKEN_ENV not in os.environ  # restored once the services stop
    written = "".join(path.read_text() for path in logs.glob("*.log"))
    assert not any(value in written for value in KEYS.values())
    # each service's config file, written beside its log: its table, never a key
    configs = {path.name: path.read_text() for path in logs.glob("*.toml")}
    assert set(configs) == {"tools.toml", "reward.toml"}
    assert 'search = "serper"' in configs["tools.toml"]
    assert not any(value in text for text in configs.values() for value in KEYS.values())
