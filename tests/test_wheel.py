"""What users install is the wheel, not the checkout: build it from the project's files, install
it alone (no dependency resolution, nothing downloaded) into a scratch virtual environment whose
dependencies come from this interpreter's site-packages, and from a folder outside the checkout
run `deepdive --help` and the recipe's `deepdive submit --dry-run`. The dry run reads the model
presets and slime's flag list, the package's data files: a file missing from the wheel (the
presets were once named `presets/*.json` in pyproject.toml) fails here, not inside the image."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deepdive", "services", "slurm")
# Qwen2.5-32B-Instruct's config.json, the keys the checks compare with the preset
QWEN_32B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "max_position_embeddings": 32768,
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,  # Qwen2.5-32B-Instruct's; slime's qwen2.5-32B.sh: --norm-epsilon 1e-5
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("setuptools") is None,
        reason="building the wheel offline needs setuptools beside this interpreter",
    ),
]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch virtual environment holding the wheel; its bin folder."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:  # the working tree's files: no build output lands in the checkout
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base)}
    build = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(base / "dist"), str(source)],
        base, env,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (base / "dist").glob("deepdive_slurm-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # the dependencies: this interpreter's site-packages, after the venv's own (a path line in
    # a .pth file; .pth files inside those folders are not read, so an editable install of the
    # checkout there stays out of sight)
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--ignore-installed", str(wheel)],
        base, env,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    # where the project is installed already (the image: /opt/venv, a dependency folder here),
    # pip would call the wheel "already satisfied" and install nothing without --ignore-installed
    assert (venv / "bin" / "deepdive").is_file(), install.stdout
    return venv / "bin"


def clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH: the checkout must not be importable."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}


def test_the_installed_package_is_the_wheels_and_reads_its_data_files(
    installed: Path, tmp_path: Path
) -> None:
    probe = (
        "import json, slurm; from slurm.backends.slime.args import presets; "
        "from slurm.backends.slime.checks import slime_flags; "
        "print(json.dumps([slurm.__file__, sorted(presets()), len(slime_flags())]))"
    )
    result = run([str(installed / "python"), "-c", probe], tmp_path, clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    where, names, flags = json.loads(result.stdout)
    assert Path(where).is_relative_to(installed.parent)  # not the checkout
    assert "qwen2.5-32B" in names and flags > 100


def test_deepdive_help_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    result = run([str(installed / "deepdive"), "--help"], tmp_path, clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "submit" in result.stdout


def test_the_recipes_dry_run_reads_the_presets_from_the_wheel(
    installed: Path, tmp_path: Path
) -> None:
    """configs/deepdive-qwen.toml as a user would copy it, with the model's config.json, the
    reference checkpoint folder and the prompt data it names made here."""
    shutil.copy2(ROOT / "configs" / "deepdive-qwen.toml", tmp_path / "recipe.toml")
    model = tmp_path / "models" / "Qwen2.5-32B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN_32B))
    (tmp_path / "models" / "reference").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "q", "label": "a"}\n')
    (tmp_path / "secrets.env").write_text("DEEPDIVE_SERVICE_TOKEN=wheel-test-token\n")
    (tmp_path / "secrets.env").chmod(0o600)
    overrides = {
        "container.image": '""',  # no image here: the job would run this Python
        "services.env_file": '"secrets.env"',  # the token the recipe's services.host needs
        "slime.model.hf_checkpoint": f'"{model}"',
        "slime.model.ref_load": f'"{tmp_path / "models" / "reference"}"',
        "slime.rollout.prompt_data": '"data/train.jsonl"',  # made here, taken from where we submit
    }
    command = [str(installed / "deepdive"), "submit", "recipe.toml", "--dry-run"]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    result = run(command, tmp_path, clean_env(tmp_path))
    assert "FileNotFoundError" not in result.stderr and "slime_presets" not in result.stderr
    assert result.returncode == 0, result.stderr
    # the preset's architecture, from the wheel's slurm/backends/slime/presets.json, in slime's command line
    assert "--num-layers 64" in result.stdout and "--hidden-size 5120" in result.stdout
    assert "wheel-test-token" not in result.stdout + result.stderr  # the dry run names, not shows
