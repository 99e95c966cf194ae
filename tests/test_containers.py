"""The images' definitions (containers/): each parses into the sections it needs, every base image
is pinned by digest and every git install by commit (containers/pins.env, the same commits the
slime backend's flag list was read at), every pip install comes from the lock (torch, the
platform's build, and the project itself aside), the labels carry the lock's hash. That the CPU
image builds and the suite passes inside its SIF is `make ci-container` (.ci/run runs it)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH, REWARD_FUNCTION_PATH
from slurm.backends.slime.config import SlimeSection

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "containers"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# the pip installs an image may run, besides the lock's
ALLOWED_PIP = (
    re.compile(r"--upgrade pip\b"),  # the installer itself
    re.compile(
        r'--find-links /tmp/wheels "?(\$\{TORCH\}|\{\{ TORCH \}\})"?'
    ),  # the platform's torch
    re.compile(r"--require-hashes -r /opt/deepdive-slurm/requirements\.lock"),  # the lock
    re.compile(r"--no-deps /opt/deepdive-slurm$"),  # the project, no dependency of its own
    # slime's image's own checkouts, moved out of /root (tests/test_containers.py)
    re.compile(r"--no-deps -e /opt/Megatron-LM -e /opt/slime$"),
)


def pins() -> dict[str, str]:
    lines = (CONTAINERS / "pins.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def sections(path: Path) -> dict[str, str]:
    """An Apptainer definition: its header keys and each %section's body."""
    text = path.read_text()
    header = dict(re.findall(r"^(Bootstrap|From):\s*(.+)$", text, re.MULTILINE))
    parts = re.split(r"^%(\w+)\s*$", text, flags=re.MULTILINE)
    return {**header, **{parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}}


@pytest.mark.parametrize(
    ("name", "base"),
    [("train.def", "{{ TRAIN_BASE }}"), ("cpu.def", "{{ CPU_BASE }}")],
)
def test_each_apptainer_definition_has_its_sections(name: str, base: str) -> None:
    found = sections(CONTAINERS / name)
    assert found["Bootstrap"] == "docker" and found["From"].strip() == base
    assert {"arguments", "files", "post", "environment", "labels", "test", "runscript"} <= set(
        found
    )
    assert "exec deepdive" in found["runscript"]
    assert "{{ LOCK_SHA256 }}" in found["labels"] and "{{ REVISION }}" in found["labels"]
    # what `deepdive submit` compares with the launcher (slurm/launch/image_labels.py)
    assert "org.opencontainers.image.version {{ VERSION }}" in found["labels"]


def test_the_training_image_labels_every_pin_and_tests_what_it_holds() -> None:
    found = sections(CONTAINERS / "train.def")
    for arg in ("SLIME_COMMIT", "MEGATRON_COMMIT", "SGLANG_VERSION", "TRAIN_BASE"):
        assert f"{{{{ {arg} }}}}" in found["labels"], arg
    for module in ("torch", "sglang", "megatron", "slime", "deepdive"):
        assert re.search(rf"\bimport .*\b{module}\b", found["test"]), module
    assert "device_count" in found["test"]  # GPU visibility
    # slime's image brings Megatron-LM patched at its pin (checked) and slime (checked out at ours)
    assert '"$megatron" != "{{ MEGATRON_COMMIT }}"' in found["post"]
    assert "git -C /opt/slime checkout --quiet {{ SLIME_COMMIT }}" in found["post"]
    assert "megatron.patch" in found["test"]  # applied, as slime's own image builds Megatron


def test_every_base_is_pinned_by_digest_and_every_git_install_by_commit() -> None:
    pinned = pins()
    assert DIGEST.match(pinned["CPU_BASE_DIGEST"])
    # the training base is a digest, or unresolved and then refused by `make image` (below)
    assert pinned["TRAIN_BASE_DIGEST"] == "" or DIGEST.match(pinned["TRAIN_BASE_DIGEST"])
    assert COMMIT.match(pinned["SLIME_COMMIT"]) and COMMIT.match(pinned["MEGATRON_COMMIT"])
    flags = json.loads((ROOT / "slurm" / "backends" / "slime" / "flags.json").read_text())[
        "sources"
    ]
    assert pinned["SLIME_COMMIT"].startswith(flags["slime"]["commit"])  # one slime, everywhere
    assert pinned["MEGATRON_COMMIT"] == flags["megatron"]["commit"]
    assert pinned["SGLANG_VERSION"] == flags["sglang"]["version"]
    containerfile = (CONTAINERS / "Containerfile.cpu").read_text()
    assert re.search(r"^ARG BASE$", containerfile, re.MULTILINE)  # no default: always a pin
    assert all(
        line.split()[1] in ("${BASE}", "${BASE} AS builder") or "${BASE}" in line
        for line in containerfile.splitlines()
        if line.startswith("FROM")
    )


def test_an_unresolved_training_base_is_refused_before_any_build() -> None:
    if pins()["TRAIN_BASE_DIGEST"]:
        pytest.skip("the training base is pinned")
    result = subprocess.run(
        [str(ROOT / "scripts" / "containers.sh"), "train"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2
        and "TRAIN_BASE_DIGEST" in result.stderr
        and "make pin-images" in result.stderr
    )


@pytest.mark.parametrize("name", ["Containerfile.cpu", "cpu.def", "train.def"])
def test_every_pip_install_comes_from_the_lock(name: str) -> None:
    text = (CONTAINERS / name).read_text().replace("\\\n", " ")
    installs = re.findall(r"pip install ((?:-q |--quiet |--no-cache-dir )*)([^&\n]+)", text)
    assert installs
    for _, arguments in installs:
        arguments = arguments.strip()
        assert any(rule.search(arguments) for rule in ALLOWED_PIP), (
            f"{name}: pip install {arguments}"
        )
    if name == "train.def":
        assert "install_from_lock.py /opt/deepdive-slurm/requirements.lock" in text


def test_extra_ca_certificates_never_reach_the_cpu_image() -> None:
    stages = (CONTAINERS / "Containerfile.cpu").read_text().split("\nFROM ")[1:]
    assert len(stages) == 2  # a builder, then the image
    assert "ca/" in stages[0] and "ca/" not in stages[1] and "ca-certificates" not in stages[1]


@pytest.mark.skipif(
    not os.access(CONTAINERS, os.W_OK) or shutil.which("git") is None,
    reason="the context is written into the checkout: here it is read-only or without git "
    "(the container CI mounts the project read-only; the host's make test runs this)",
)
def test_the_context_labels_the_lock_it_installs(tmp_path: Path) -> None:
    """What `make image-context` writes: the project as committed and the build arguments,
    among them the lock's hash the labels carry."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "containers.sh"), "context"],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    build = CONTAINERS / "build"
    arguments = dict(line.split("=", 1) for line in (build / "cpu.args").read_text().splitlines())
    lock = hashlib.sha256((ROOT / "requirements.lock").read_bytes()).hexdigest()
    assert arguments["LOCK_SHA256"] == lock
    assert (build / "project" / "requirements.lock").read_bytes() == (
        ROOT / "requirements.lock"
    ).read_bytes()
    assert list((build / "wheels").glob("torch-*.whl"))
    assert not list((build / "ca").iterdir())  # no EXTRA_CA_DIR: no certificate
    train = dict(line.split("=", 1) for line in (build / "train.args").read_text().splitlines())
    assert train["SLIME_COMMIT"] == pins()["SLIME_COMMIT"] and train["LOCK_SHA256"] == lock


def test_install_from_lock_reads_every_pin_with_its_hashes() -> None:
    spec = importlib.util.spec_from_file_location(
        "install_from_lock", CONTAINERS / "install_from_lock.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.entries(ROOT / "requirements.lock")
    lock = (ROOT / "requirements.lock").read_text()
    assert len(found) == len(re.findall(r"^[A-Za-z0-9._-]+==", lock, re.MULTILINE))
    assert all(
        hashes and all(h.startswith("--hash=sha256:") for h in hashes) for *_, hashes in found
    )


# A stand-in for Apptainer (not installable on this host; the container CI runs the real one
# inside podman): it records how it was called and what the build context held at that moment.
FAKE_APPTAINER = """#!/bin/sh
[ "$1" = --version ] && { echo "apptainer version ${FAKE_APPTAINER_VERSION:-1.4.5}"; exit 0; }
{ echo "argv: $*"; echo "cwd: $(pwd)"
  test -f containers/build/project/pyproject.toml && echo "project: yes"
  test -f containers/build/train.args && sed 's/^/args: /' containers/build/train.args
} > "$APPTAINER_RECORD"
exit "${FAKE_APPTAINER_EXIT:-0}"
"""


@pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("make") is None,
    reason="needs git and make (the build host's tools)",
)
def test_make_image_runs_on_a_fresh_build_host_without_a_venv(tmp_path: Path) -> None:
    """`make image` on a machine that never ran `make setup`: no .venv, no PYTHON, nothing but
    git, make and Apptainer on PATH. The training image's context needs no Python (the torch
    wheel is the CPU image's only)."""
    checkout = tmp_path / "checkout"
    for name in (
        "Makefile", "pyproject.toml", "requirements.lock", "README.md",
        "scripts/containers.sh", "scripts/apt-install.sh", "containers/train.def",
        "containers/install_from_lock.py", "containers/pins.env", "containers/train_checks.py",
    ):  # fmt: skip
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    pinned = (checkout / "containers" / "pins.env").read_text()
    digest = "sha256:" + "0" * 64  # as `make pin-images` would write it, with its record
    (checkout / "containers" / "pins.env").write_text(
        re.sub(r"^TRAIN_BASE_DIGEST=.*$", f"TRAIN_BASE_DIGEST={digest}", pinned, flags=re.M)
    )
    base_name = pins()["TRAIN_BASE_TAG"].rsplit(":", 1)[0]
    base_record = {"format": 1, "image": f"{base_name}@{digest}", "problems": []}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(checkout)]
    subprocess.run([*git[:5], "init", "-q", str(checkout)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fresh"], check=True)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    record = tmp_path / "apptainer.txt"

    def image() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-C", str(checkout), "image"],
            capture_output=True, text=True, timeout=120,
            env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "APPTAINER_RECORD": str(record)},
        )  # fmt: skip

    # no record of the base (`make pin-images` pulls it once and records it): refused before
    # the build's download, as is a record naming a problem
    unrecorded = image()
    assert unrecorded.returncode != 0 and "run 'make pin-images'" in unrecorded.stderr
    assert not record.exists()
    kept = checkout / "containers" / "base-record.json"  # uncommitted, as pin-images leaves it
    kept.write_text(json.dumps({**base_record, "problems": ["its Megatron-LM is at 1dc"]}))
    problem = image()
    assert problem.returncode != 0 and "its Megatron-LM is at 1dc" in problem.stderr
    assert not record.exists()
    kept.write_text(json.dumps(base_record))
    result = image()
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (checkout / ".venv").exists()
    lines = record.read_text().splitlines()
    build = checkout / "containers" / "build"
    assert lines[0] == (
        f"argv: build --build-arg-file {build}/train.args deepdive-train.sif containers/train.def"
    )
    assert "project: yes" in lines
    built = checkout / "containers" / "build" / "project" / "containers" / "base-record.json"
    assert json.loads(built.read_text()) == base_record  # what %post checks the base against
    name, tag = pins()["TRAIN_BASE_TAG"].rsplit(":", 1)
    assert f"args: TRAIN_BASE={name}@{digest}" in lines and "/" not in tag  # no TAG@DIGEST
    assert f"args: TRAIN_BASE_TAG={name}:{tag}" in lines  # kept, as a label
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"args: VERSION={version}" in lines  # the label submit compares
    record.unlink()
    notest = subprocess.run(
        ["make", "-C", str(checkout), "image", "NOTEST=1"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "APPTAINER_RECORD": str(record)},
    )  # fmt: skip
    # a build host without a GPU driver: %test is left to `apptainer test --nv` on a GPU node
    assert notest.returncode == 0, notest.stderr
    assert record.read_text().splitlines()[0] == (
        f"argv: build --notest --build-arg-file {build}/train.args deepdive-train.sif "
        "containers/train.def"
    )
    for version, builds in (("1.3.6", True), ("1.2.0", True), ("1.1.9", False)):
        record.unlink(missing_ok=True)
        other = subprocess.run(
            ["make", "-C", str(checkout), "image"],
            capture_output=True, text=True, timeout=120,
            env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path),
                 "APPTAINER_RECORD": str(record), "FAKE_APPTAINER_VERSION": version},
        )  # fmt: skip
        # NAME@DIGEST builds with 1.2 and 1.3 (which refuse TAG@DIGEST); before 1.2 the def's
        # {{ }} arguments do not exist: said before building
        assert (other.returncode == 0) == builds == record.exists(), (version, other.stderr)
        if not builds:
            assert f"apptainer version {version}: the training image's build needs" in (
                other.stderr
            )


# The training image (containers/train.def) as far as a CPU host can check it: it is slime's own
# image for the pinned commit, its checkouts live where every user can read them (Apptainer runs
# the job as the submitter; slime's image keeps them in /root, mode 0700), and its %test imports
# slime's real training path with everything slime's docker/Dockerfile adds (at 624b824: Transformer
# Engine line 60, apex's CUDA extensions line 66, torch_memory_saver line 77, requirements.txt
# line 105, numpy 1.x line 109, the router build line 111, the Megatron patches lines 118-133,
# the SGLang patches lines 137-150), checks the base's patches are applied and are the pin's,
# and fails on a `pip check` conflict the bare base did not have.
# The image itself is built where a registry is reachable (`make image`).

TRAIN = CONTAINERS / "train.def"
# slime's docker/Dockerfile at 624b824, line 140: the SGLang patches, in the order it applies them
SGLANG_PATCHES = (
    "sglang.patch",
    "sglang-top_p.patch",
    "sglang-release_hicache.patch",
    "sglang-pull_weights.patch",
    "sglang-deterministic.patch",
)
# lines 118-133: megatron.patch, then megatron-sglang-aligned.patch when present
MEGATRON_PATCHES = ("megatron.patch", "megatron-sglang-aligned.patch")
# what train.py reaches and what that path needs (the list, names checked at 624b824:
# slime/ray/placement_group.py, slime/rollout/sglang_rollout.py,
# slime/backends/megatron_utils/model_provider.py and actor.py, which imports torch_memory_saver
# at line 12; slime/observability/logging_utils.py line 3 imports wandb;
# slime/rollout/rm_hub/math_utils.py line 10 imports pylatexenc; Megatron's ColumnParallelLinear
# needs apex's fused_weight_gradient_mlp_cuda with gradient_accumulation_fusion)
REQUIRED_IMPORTS = (
    "slime.ray.placement_group",
    "slime.rollout.sglang_rollout",
    "slime.backends.megatron_utils.model_provider",
    "slime.backends.megatron_utils.actor",
    "transformer_engine.pytorch",
    "fused_weight_gradient_mlp_cuda",
    "torch_memory_saver",
    "wandb",
    "pylatexenc",
    "sglang_router",
    "numpy",
    "deepdive.rollout_settings",
    "slime.utils.misc",
)


def percent_test() -> str:
    return sections(TRAIN)["test"]


def heredoc_python(shell: str) -> tuple[str, str]:
    """The %test's Python heredoc as /bin/sh reads it (the body ends at a line that is exactly
    the delimiter; Apptainer keeps a section's indentation), and the shell around it."""
    lines = shell.splitlines()
    starts = [i for i, line in enumerate(lines) if re.search(r"python3 - <<'PY'\s*$", line)]
    assert len(starts) == 1, "one Python heredoc in %test"
    ends = [i for i in range(starts[0] + 1, len(lines)) if lines[i] == "PY"]
    assert ends, "the heredoc never ends: its delimiter must be a line 'PY' at column 0"
    body = "\n".join(lines[starts[0] + 1 : ends[0]])
    around = "\n".join(lines[: starts[0] + 1] + lines[ends[0] + 1 :])
    return body, around


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def substituted(text: str) -> str:
    """A section with Apptainer's {{ ARG }} templates filled as a build fills them."""
    values = {**pins(), "TRAIN_BASE": "docker.io/x@sha256:0", "REVISION": "r", "VERSION": "v"}
    return re.sub(r"\{\{ (\w+) \}\}", lambda match: values.get(match.group(1), "x"), text)


def test_the_base_is_slimes_own_image_pinned_by_digest_or_refused() -> None:
    pinned = pins()
    assert pinned["TRAIN_BASE_TAG"].startswith("docker.io/slimerl/slime:"), pinned["TRAIN_BASE_TAG"]
    # slime's docker/version.txt at 624b824 reads nightly-dev-20260810a; the tag carries it
    assert "nightly-dev-20260810a" in pinned["TRAIN_BASE_TAG"]
    assert pinned["TRAIN_BASE_DIGEST"] == "" or re.fullmatch(
        r"sha256:[0-9a-f]{64}", pinned["TRAIN_BASE_DIGEST"]
    )
    header = TRAIN.read_text().split("Bootstrap:")[0]
    assert "Why slime's image" in header  # the choice, said where the image is defined


def test_the_test_section_imports_slimes_training_path_and_our_hooks() -> None:
    body, _ = heredoc_python(percent_test())
    tree = ast.parse(body)  # the Python %test runs, exactly as the shell hands it over
    missing = [name for name in REQUIRED_IMPORTS if name not in imported(tree)]
    assert not missing, f"%test does not import {missing}"
    assert '"/opt/slime/train.py"' in body  # train.py's own imports, its main not run
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_function"
    ]
    assert calls, "the hooks are loaded with slime's load_function"
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.For) and calls[0] in ast.walk(n))
    assert isinstance(loop.iter, ast.Tuple)
    assert [getattr(e, "id", "") for e in loop.iter.elts] == [
        "GENERATE_FUNCTION_PATH",
        "REWARD_FUNCTION_PATH",
    ]
    # what the launcher tells slime to load is what %test loads
    assert GENERATE_FUNCTION_PATH.startswith("deepdive.generate.")
    assert REWARD_FUNCTION_PATH.startswith("deepdive.reward.")
    assert 'numpy.__version__.startswith("1.")' in body
    assert '"slime" in sglang_router.__version__' in body  # slime's own check, Dockerfile l.112


def test_the_build_checks_conflicts_against_the_bases_own_and_every_step_is_fatal() -> None:
    """%post first checks the bare base against its record (`make pin-images`: its pip check
    among the rest); %test fails on what is new (a plain `pip check` fails on slime's own
    image: its Dockerfile leaves conflicts)."""
    post = sections(TRAIN)["post"].replace("\\\n", " ").splitlines()  # continued lines joined
    post = [" ".join(line.split()) for line in post if line.strip()]
    post = [line for line in post if not line.startswith("#")]
    assert post[0] == "set -eu"
    assert post[1] == (
        "python3 /opt/deepdive-slurm/containers/train_checks.py matches"
        " --slime-commit {{ SLIME_COMMIT }} --megatron-commit {{ MEGATRON_COMMIT }}"
        ' --sglang-version "{{ SGLANG_VERSION }}" --slime-repository {{ SLIME_REPOSITORY }}'
        " /opt/deepdive-slurm/containers/base-record.json"
    )  # before anything is installed or moved
    _, shell = heredoc_python(percent_test())
    commands = [line.strip() for line in shell.splitlines() if line.strip()]
    commands = [line for line in commands if not line.startswith("#")]
    assert commands[0] == "set -eu"
    assert "pip check" not in commands
    for check in (
        '$checks sglang /sgl-workspace/sglang "{{ SGLANG_VERSION }}"',
        "$checks uvicorn /opt/deepdive-slurm",
        "$checks conflicts /opt/deepdive-slurm/containers/base-record.json",
    ):
        assert check in commands, check  # alone on its line: its failure stops the build
    assert "|| echo" not in shell and "|| true" not in shell


@pytest.mark.parametrize("name", ["post", "test"])
def test_each_shell_section_parses_in_the_shell_apptainer_runs(name: str) -> None:
    shells = [shell for shell in ("dash", "bash") if shutil.which(shell)]
    assert shells
    text = substituted(sections(TRAIN)[name])
    for shell in shells:
        result = subprocess.run([shell, "-n"], input=text, capture_output=True, text=True)
        assert result.returncode == 0, f"{shell}: {result.stderr}"


def test_the_test_section_checks_slimes_patches_in_dockerfile_order() -> None:
    calls = {}
    for command in percent_test().replace("\\\n", " ").splitlines():  # continued lines joined
        words = command.split()
        if words[:2] == ["$checks", "patches"]:
            calls[words[2]] = [Path(word).name for word in words[3:]]
    assert calls == {
        "/sgl-workspace/sglang": list(SGLANG_PATCHES),
        "/opt/Megatron-LM": list(MEGATRON_PATCHES),
    }
    # the record of the pulled base checks them in the same order
    checks = load_checks()
    assert (checks.SGLANG_PATCHES, checks.MEGATRON_PATCHES) == (SGLANG_PATCHES, MEGATRON_PATCHES)
    # the patches the base's own build applied (kept by %post before the pin is checked out)
    assert "patches=/opt/deepdive-slurm/base-patches" in percent_test()
    post = sections(TRAIN)["post"]
    keep = post.index("cp -r /opt/slime/docker/patch/latest /opt/deepdive-slurm/base-patches")
    assert keep < post.index("git -C /opt/slime checkout --quiet {{ SLIME_COMMIT }}")


def load_checks() -> Any:
    spec = importlib.util.spec_from_file_location("train_checks", CONTAINERS / "train_checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("git") is None, reason="the check runs git apply")
def test_the_patch_check_tells_applied_patches_from_missing_ones(tmp_path: Path) -> None:
    """The check %test and the base's record run (`train_checks.py patches`) on a tree patched
    as slime's Dockerfile patches SGLang: two patches touching one file, applied in order, then
    the first one left out."""
    tree, patches = tmp_path / "tree", tmp_path / "patches"
    tree.mkdir()
    patches.mkdir()
    (tree / "shared.py").write_text("a = 1\nb = 2\n")
    (tree / "only_first.py").write_text("x = 1\n")

    def diff(name: str, path: str, before: str, after: str) -> Path:
        old, new = tmp_path / "old", tmp_path / "new"
        old.write_text(before)
        new.write_text(after)
        text = subprocess.run(
            ["git", "diff", "--no-index", f"--src-prefix=a/{path}#", f"--dst-prefix=b/{path}#",
             str(old), str(new)],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        text = re.sub(rf"([ab]/{re.escape(path)})#\S+", r"\1", text)
        (patches / name).write_text(text)
        return patches / name

    first_shared = diff("first.patch", "shared.py", "a = 1\nb = 2\n", "a = 10\nb = 2\n")
    first_only = diff("first_only.patch", "only_first.py", "x = 1\n", "x = 11\n")
    (patches / "first.patch").write_text(first_shared.read_text() + first_only.read_text())
    diff("second.patch", "shared.py", "a = 10\nb = 2\n", "a = 10\nb = 20\n")

    def check() -> subprocess.CompletedProcess[str]:
        names = ("first.patch", "absent.patch", "second.patch")
        return train_checks(None, "patches", str(tree), *(str(patches / name) for name in names))

    assert check().returncode == 1  # nothing applied yet
    for name in ("first.patch", "second.patch"):
        subprocess.run(["git", "apply", str(patches / name)], cwd=tree, check=True)
    result = check()
    assert result.returncode == 0, result.stderr  # both in, the shared file judged by the last
    subprocess.run(["git", "apply", "-R", str(patches / "first_only.patch")], cwd=tree, check=True)
    result = check()
    assert result.returncode == 1 and "first.patch not applied" in result.stderr


def test_slime_and_megatron_live_where_every_user_can_read_them() -> None:
    found = sections(TRAIN)
    post = found["post"]
    assert "mv /root/slime /opt/slime" in post and "mv /root/Megatron-LM /opt/Megatron-LM" in post
    assert re.search(r"^\s*pip install .*-e /opt/Megatron-LM -e /opt/slime\s*$", post, re.M)
    assert "chmod -R a+rX /opt/slime /opt/Megatron-LM" in post
    assert "git -C /opt/slime checkout --quiet {{ SLIME_COMMIT }}" in post
    # nothing the job reads stays in /root
    for name in ("environment", "test", "runscript", "labels"):
        assert "/root" not in found[name], name
    exports = dict(re.findall(r"^\s*export (\w+)=(\S+)", found["environment"], re.MULTILINE))
    path = exports["PYTHONPATH"].split("$")[0].rstrip(":").split(":")
    assert path == ["/opt/slime", "/opt/Megatron-LM"]
    # the %test checks the mode bits (a non-root run cannot be tested here)
    assert "-perm -o+r" in found["test"] and "-perm -o+x" in found["test"]
    assert "stat.S_IROTH" in found["test"] and "stat.S_IXOTH" in found["test"]


def test_the_launchers_defaults_and_the_recipes_name_the_images_paths() -> None:
    environment = sections(TRAIN)["environment"]
    python_path = re.search(r"PYTHONPATH=([^$]+)\$", environment)
    assert python_path is not None
    in_image = python_path.group(1).rstrip(":").split(":")
    default = SlimeSection()
    assert default.python_path == in_image
    assert default.slime_root == in_image[0] == "/opt/slime"
    for config in sorted((ROOT / "configs").glob("*.toml")):
        slime = tomllib.loads(config.read_text()).get("run", {}).get("backend")
        table = tomllib.loads(config.read_text()).get("slime", {})
        if slime == "slime" or "slime_root" in table:
            assert table.get("slime_root", default.slime_root) == "/opt/slime", config.name
            assert table.get("python_path", default.python_path) == in_image, config.name


# The image's build decisions (containers/train_checks.py, run by train.def) against fake bases:
# an environment holding the distributions slime's image has, shaped as the issue found them.
CHECKS = CONTAINERS / "train_checks.py"


def dist(site: Path, name: str, version: str, *requires: str, editable: Path | None = None) -> None:
    """A distribution's metadata as pip installs it (no code: the checks read metadata)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    (info / "METADATA").write_text(
        "\n".join(lines + [f"Requires-Dist: {r}" for r in requires]) + "\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    if editable is not None:
        url = {"url": f"file://{editable}", "dir_info": {"editable": True}}
        (info / "direct_url.json").write_text(json.dumps(url))


@pytest.fixture
def fake_base(tmp_path: Path) -> tuple[Path, Path]:
    """(python, site-packages) of slime's image in miniature: SGLang a dev build installed
    editable from its tree, SGLang's own uvicorn, and a conflict slime's Dockerfile leaves
    (numpy downgraded under a package that wants 2.x)."""
    base = tmp_path / "base"
    subprocess.run(
        [sys.base_prefix + "/bin/python3.11", "-m", "venv", "--without-pip", base], check=True
    )
    site = base / "lib" / "python3.11" / "site-packages"
    tree = tmp_path / "sgl-workspace" / "sglang"
    (tree / "python").mkdir(parents=True)
    dist(site, "sglang", "0.0.0.dev1+g06ffdbe22", "uvicorn", editable=tree / "python")
    dist(site, "uvicorn", "0.30.6")
    dist(site, "numpy", "1.26.4")
    dist(site, "opencv-python-headless", "4.12.0.88", "numpy>=2")
    return base / "bin" / "python", site


def train_checks(python: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """The checks on a fake base, which sees only its own site-packages: the container CI runs
    the suite with PYTHONPATH=/src, whose deepdive_slurm.egg-info would shadow the fake's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    target = ["--python", str(python)] if python else []
    return subprocess.run(
        [sys.executable, str(CHECKS), *target, *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
SGLANG_PATCH = (
    "diff --git a/server.py b/server.py\n--- a/server.py\n+++ b/server.py\n"
    "@@ -1 +1 @@\n-top_p = 1.0\n+top_p = 0.9\n"
)
MEGATRON_PATCH = (
    "diff --git a/model.py b/model.py\n--- a/model.py\n+++ b/model.py\n"
    "@@ -1 +1 @@\n-fused = False\n+fused = True\n"
)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def slime_base(fake_base: tuple[Path, Path], tmp_path: Path) -> dict[str, str]:
    """slime's image in miniature under tmp_path, as its Dockerfile leaves it: /root/slime at the
    commit it was built from (its clone also holds a later commit with the same patches and one
    that changes them), /root/Megatron-LM and SGLang's tree with those patches applied."""
    slime = tmp_path / "root" / "slime"
    patches = slime / "docker" / "patch" / "latest"
    patches.mkdir(parents=True)
    (patches / "sglang.patch").write_text(SGLANG_PATCH)
    (patches / "megatron.patch").write_text(MEGATRON_PATCH)
    git(slime, "init", "-q")
    git(slime, "add", "-A")
    git(slime, "commit", "-q", "-m", "the base's slime")
    built = git(slime, "rev-parse", "HEAD")
    (slime / "train.py").write_text("# later\n")
    git(slime, "add", "-A")
    git(slime, "commit", "-q", "-m", "same patches")
    same = git(slime, "rev-parse", "HEAD")
    (patches / "sglang.patch").write_text(SGLANG_PATCH.replace("0.9", "0.95"))
    git(slime, "commit", "-q", "-am", "other patches")
    other = git(slime, "rev-parse", "HEAD")
    git(slime, "checkout", "-q", built)
    megatron = tmp_path / "root" / "Megatron-LM"
    megatron.mkdir()
    (megatron / "model.py").write_text("fused = False\n")
    git(megatron, "init", "-q")
    git(megatron, "add", "-A")
    git(megatron, "commit", "-q", "-m", "megatron")
    git(megatron, "apply", str(patches / "megatron.patch"))
    tree = tmp_path / "sgl-workspace" / "sglang"
    (tree / "server.py").write_text("top_p = 0.9\n")  # sglang.patch applied
    python, _ = fake_base
    return {
        "python": str(python), "root": str(tmp_path), "built": built, "same": same,
        "other": other, "megatron": git(megatron, "rev-parse", "HEAD"),
    }  # fmt: skip


IMAGE = "docker.io/slimerl/slime@sha256:" + "1" * 64


def record_base(
    python: Path | str, root: Path | str, *, pin: str = "", megatron: str = "", image: str = IMAGE
) -> subprocess.CompletedProcess[str]:
    """`train_checks.py record` of a fake base, as `make pin-images` runs it in the pulled one."""
    return train_checks(
        Path(python), "--root", str(root), "record", "--image", image,
        "--slime-commit", pin or "0" * 40, "--megatron-commit", megatron or "0" * 40,
        "--sglang-version", pins()["SGLANG_VERSION"],
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("git") is None, reason="the record reads git checkouts")
def test_the_pulled_base_is_recorded_with_what_would_fail_the_build(
    slime_base: dict[str, str], tmp_path: Path
) -> None:
    base = slime_base
    recorded = tmp_path / "base-record.json"

    def record(**overrides: str) -> dict[str, Any]:
        values = {"pin": base["same"], "megatron": base["megatron"], **overrides}
        found = record_base(base["python"], base["root"], **values)
        assert found.returncode == 0, found.stderr
        recorded.write_text(found.stdout)
        parsed: dict[str, Any] = json.loads(found.stdout)
        return parsed

    good = record()
    assert good["problems"] == []
    assert good["image"] == IMAGE
    assert good["slime"] == {"commit": base["built"], "pin": base["same"], "pin_patches": "same"}
    assert good["megatron"]["commit"] == base["megatron"]
    assert good["sglang"]["version"] == "0.0.0.dev1+g06ffdbe22"  # a dev build: the tree decides
    assert (good["uvicorn"], good["numpy"]) == ("0.30.6", "1.26.4")  # SGLang's: the lock replaces
    digest = hashlib.sha256(SGLANG_PATCH.encode()).hexdigest()
    assert good["patches"]["sglang.patch"] == {"sha256": digest, "applied": True}
    assert good["patches"]["megatron.patch"]["applied"] is True
    ready = train_checks(None, "ready", str(recorded), IMAGE)
    assert ready.returncode == 0, ready.stderr
    moved = train_checks(None, "ready", str(recorded), IMAGE.replace("1" * 64, "2" * 64))
    assert moved.returncode != 0 and f"records {IMAGE}, containers/pins.env names" in moved.stderr
    matches = train_checks(
        Path(base["python"]), "--root", base["root"], "matches", str(recorded),
        "--slime-commit", base["same"], "--megatron-commit", base["megatron"],
        "--sglang-version", pins()["SGLANG_VERSION"],
    )  # fmt: skip
    assert matches.returncode == 0, matches.stderr

    # the nightly was built from another slime than the pin (#2262's branch): named, refused
    other = record(pin=base["other"])["problems"]
    assert other == [
        f"it was built with slime {base['built']}'s patches; {base['other']}'s differ: sglang.patch"
    ]
    refused = train_checks(None, "ready", str(recorded), IMAGE)
    assert refused.returncode != 0 and "would fail the build" in refused.stderr
    assert "sglang.patch" in refused.stderr
    absent = record(pin="f" * 40)["problems"]
    assert len(absent) == 1 and f"the base's slime clone lacks {'f' * 40}" in absent[0]
    wrong = record(megatron="e" * 40)["problems"]
    assert wrong == [
        f"its Megatron-LM is at {base['megatron']}, containers/pins.env says {'e' * 40}"
    ]
    tree = Path(base["root"]) / "sgl-workspace" / "sglang"
    (tree / "server.py").write_text("top_p = 1.0\n")  # sglang.patch not applied
    unpatched = record()
    assert unpatched["problems"] == [
        "sglang.patch is not applied in the base: it is not the slime image it says it is"
    ]
    assert unpatched["patches"]["sglang.patch"]["applied"] is False


@pytest.mark.skipif(shutil.which("git") is None, reason="the record reads git checkouts")
def test_the_build_starts_only_from_the_base_its_record_describes(
    slime_base: dict[str, str], tmp_path: Path
) -> None:
    base = slime_base
    recorded = tmp_path / "base-record.json"
    found = record_base(base["python"], base["root"], pin=base["same"], megatron=base["megatron"])
    recorded.write_text(found.stdout)
    site = Path(base["python"]).parent.parent / "lib" / "python3.11" / "site-packages"
    shutil.rmtree(site / "uvicorn-0.30.6.dist-info")
    dist(site, "uvicorn", "0.31.0")  # not the base that was pulled and recorded
    matches = train_checks(
        Path(base["python"]), "--root", base["root"], "matches", str(recorded),
        "--slime-commit", base["same"], "--megatron-commit", base["megatron"],
        "--sglang-version", pins()["SGLANG_VERSION"],
    )  # fmt: skip
    assert matches.returncode != 0
    assert "uvicorn: '0.31.0', recorded '0.30.6'" in matches.stderr
    absent = train_checks(None, "ready", str(tmp_path / "none.json"), IMAGE)
    assert absent.returncode != 0 and "run 'make pin-images'" in absent.stderr
    recorded.write_text("{")
    broken = train_checks(None, "ready", str(recorded), IMAGE)
    assert broken.returncode != 0 and "is not a base record" in broken.stderr


FAKE_PIN_TOOLS = {
    "skopeo": '#!/bin/sh\necho "sha256:$(printf %064d 7)"\n',
    # `build --sandbox DIR docker://IMAGE` pulls; `exec … DIR python3 SCRIPT ARGS` runs the
    # record with the host's Python on the fake base (FAKE_ROOT, FAKE_BASE_PYTHON)
    "apptainer": (
        "#!/bin/sh\n"
        'echo "$*" >> "$APPTAINER_LOG"\n'
        'case "$1" in\n'
        '  build) [ -n "${FAKE_PULL_FAILS:-}" ] && exit 1; mkdir -p "$5" ;;\n'
        '  exec) while [ "$1" != python3 ]; do shift; done; shift 2\n'
        '        exec "$HOST_PYTHON" "$CHECKS" --root "$FAKE_ROOT" --python "$FAKE_BASE_PYTHON"'
        ' "$@" ;;\n'
        "esac\n"
    ),
}


@pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make"
)
def test_pin_images_pulls_the_base_once_and_records_it_with_its_digest(
    slime_base: dict[str, str], tmp_path: Path
) -> None:
    checkout = tmp_path / "checkout"
    for name in (
        "Makefile", "scripts/containers.sh", "scripts/apt-install.sh", "containers/pins.env",
        "containers/train_checks.py",
    ):  # fmt: skip
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    pinned = checkout / "containers" / "pins.env"
    pinned.write_text(
        re.sub(r"^SLIME_COMMIT=.*$", f"SLIME_COMMIT={slime_base['same']}", pinned.read_text(), flags=re.M)
        .replace(pins()["MEGATRON_COMMIT"], slime_base["megatron"])
    )  # fmt: skip
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in FAKE_PIN_TOOLS.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    log = tmp_path / "apptainer.log"
    env = {
        "PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "APPTAINER_LOG": str(log),
        "HOST_PYTHON": sys.executable, "CHECKS": str(CHECKS), "FAKE_ROOT": slime_base["root"],
        "FAKE_BASE_PYTHON": slime_base["python"],
    }  # fmt: skip

    def pin(**more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-s", "-C", str(checkout), "pin-images"],
            capture_output=True, text=True, timeout=120, env={**env, **more},
        )  # fmt: skip

    failed = pin(FAKE_PULL_FAILS="1")  # the digests move only with their record
    assert failed.returncode != 0
    assert not (checkout / "containers" / "base-record.json").exists()
    assert "TRAIN_BASE_DIGEST=\n" in pinned.read_text()
    done = pin()
    assert done.returncode == 0, done.stdout + done.stderr
    digest = "sha256:" + "7".zfill(64)
    assert f"TRAIN_BASE_DIGEST={digest}\n" in pinned.read_text()
    name = pins()["TRAIN_BASE_TAG"].rsplit(":", 1)[0]
    kept = json.loads((checkout / "containers" / "base-record.json").read_text())
    assert kept["image"] == f"{name}@{digest}" and kept["problems"] == []
    assert kept["slime"]["commit"] == slime_base["built"]
    sandbox = checkout / "containers" / "build" / "base-sandbox"
    assert log.read_text().splitlines()[0] == (
        f"build --force --fix-perms --sandbox {sandbox} docker://{name}@{digest}"
    )
    assert not sandbox.exists()  # removed once recorded (KEEP_SANDBOX=1 keeps it)
    pinned.write_text(
        pinned.read_text().replace(
            f"SLIME_COMMIT={slime_base['same']}", f"SLIME_COMMIT={slime_base['other']}"
        )
    )
    refused = pin()  # recorded, and what would fail the build named now
    assert refused.returncode != 0 and "would fail the build" in refused.stderr
    assert json.loads((checkout / "containers" / "base-record.json").read_text())["problems"]


def test_only_the_conflicts_this_build_adds_fail_it(
    fake_base: tuple[Path, Path], tmp_path: Path
) -> None:
    python, site = fake_base
    recorded = tmp_path / "base-record.json"
    found = record_base(python, tmp_path)
    assert found.returncode == 0, found.stderr
    recorded.write_text(found.stdout)
    assert (
        "opencv-python-headless 4.12.0.88 has requirement numpy>=2, but you have numpy 1.26.4."
        in json.loads(found.stdout)["pip_check"]
    )
    same = train_checks(python, "conflicts", str(recorded))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "the base's own" in same.stdout
    dist(site, "deepdive-slurm", "0.1.0", "uvicorn>=0.54,<0.55")  # ours, against SGLang's uvicorn
    added = train_checks(python, "conflicts", str(recorded))
    assert added.returncode != 0
    assert (
        "deepdive-slurm 0.1.0 has requirement uvicorn<0.55,>=0.54, but you have uvicorn 0.30.6"
        in added.stderr
    )


def test_the_services_never_run_on_a_uvicorn_minor_they_were_not_written_for(
    fake_base: tuple[Path, Path],
) -> None:
    python, site = fake_base
    theirs = train_checks(python, "uvicorn", str(ROOT))
    assert theirs.returncode != 0 and "uvicorn 0.30.6 is installed" in theirs.stderr
    shutil.rmtree(site / "uvicorn-0.30.6.dist-info")  # what install_from_lock.py does: the lock's
    locked = re.search(r"^uvicorn==(\S+)", (ROOT / "requirements.lock").read_text(), re.MULTILINE)
    assert locked is not None
    dist(site, "uvicorn", locked.group(1))
    ours = train_checks(python, "uvicorn", str(ROOT))
    assert ours.returncode == 0, ours.stderr


def test_install_from_lock_keeps_the_bases_packages_but_replaces_its_uvicorn(
    fake_base: tuple[Path, Path],
) -> None:
    """Run with the fake base's own interpreter (as %post runs it with the image's): numpy stays
    at the base's 1.26.4 (slime's Dockerfile pins it for Megatron), SGLang's uvicorn is replaced
    by the lock's, what the base lacks comes from the lock with its hashes."""
    python, _ = fake_base
    result = subprocess.run(
        [str(python), str(CONTAINERS / "install_from_lock.py"), "--dry-run",
         str(ROOT / "requirements.lock")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lock = (ROOT / "requirements.lock").read_text()
    pinned = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", lock, re.MULTILINE))
    out = result.stdout
    assert f"kept numpy 1.26.4 (the lock has {pinned['numpy']})" in out
    assert f"replacing uvicorn 0.30.6 with the lock's {pinned['uvicorn']}" in out
    wanted = out.split("would install:\n", 1)[1]
    assert re.search(rf"^uvicorn=={re.escape(pinned['uvicorn'])}\b", wanted, re.MULTILINE)
    assert re.search(r"^submitit==", wanted, re.MULTILINE) and "--hash=sha256:" in wanted
    assert not re.search(r"^numpy==", wanted, re.MULTILINE)


def test_sglang_is_checked_by_its_tree_not_its_version_string(
    fake_base: tuple[Path, Path], tmp_path: Path
) -> None:
    python, site = fake_base
    tree = tmp_path / "sgl-workspace" / "sglang"
    pinned = pins()["SGLANG_VERSION"]
    dev = train_checks(python, "sglang", str(tree), pinned)  # slime's dev images: 0.0.0.dev1+g…
    assert dev.returncode == 0, dev.stderr
    assert "0.0.0.dev1+g06ffdbe22 from the patched tree" in dev.stdout
    shutil.rmtree(site / "sglang-0.0.0.dev1+g06ffdbe22.dist-info")
    dist(site, "sglang", "0.5.14", editable=tree / "python")
    other = train_checks(python, "sglang", str(tree), pinned)
    assert other.returncode != 0 and f"containers/pins.env says {pinned}" in other.stderr
    shutil.rmtree(site / "sglang-0.5.14.dist-info")
    dist(site, "sglang", pinned)  # a wheel in site-packages: not the patched tree
    elsewhere = train_checks(python, "sglang", str(tree), pinned)
    assert elsewhere.returncode != 0 and "not from the patched tree" in elsewhere.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_gpu_smoke_runs_the_images_own_test_with_the_driver_first(tmp_path: Path) -> None:
    """`make gpu-smoke IMAGE=…` on a GPU node: `apptainer test --nv IMAGE` (the %test a
    `make image NOTEST=1` build left out), then the kit; a failed %test stops it there."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    record = tmp_path / "apptainer.txt"

    def smoke(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-s", "-C", str(ROOT), "gpu-smoke", "IMAGE=/images/train.sif",
             "SMOKE_PYTHON=echo kit"],
            capture_output=True, text=True, timeout=60,
            env={"PATH": f"{tools}:/usr/bin:/bin", "APPTAINER_RECORD": str(record), **env},
        )  # fmt: skip

    passed = smoke()
    assert passed.returncode == 0, passed.stderr
    assert record.read_text().splitlines()[0] == "argv: test --nv /images/train.sif"
    assert passed.stdout.strip() == "kit -m slurm.cli smoke"
    failed = smoke(FAKE_APPTAINER_EXIT="1")
    assert failed.returncode != 0 and "kit" not in failed.stdout


def patch_checks(root: Path) -> str:
    """%test's patch checks (from `applied` to the comparison with the pin's patches), on a
    fake base under ROOT: its /opt and /sgl-workspace moved there."""
    shell = percent_test()
    start = shell.index('checks="python3 /opt/deepdive-slurm/containers/train_checks.py"')
    end = shell.index("fi\n", shell.index('diff -r "$patches"')) + 3
    checks = "python3 /opt/deepdive-slurm/containers/train_checks.py"
    fragment = substituted(shell[start:end]).replace(checks, "$CHECKS")
    fragment = fragment.replace("/opt/", f"{root}/opt/")
    fragment = fragment.replace("/sgl-workspace/", f"{root}/sgl-workspace/")
    return fragment.replace("$CHECKS", f"{sys.executable} {CHECKS}")


@pytest.mark.skipif(shutil.which("git") is None, reason="the check runs git apply")
def test_the_patch_checks_on_a_fake_base(tmp_path: Path) -> None:
    """A base built from another slime commit (a nightly from a branch): its own patches
    applied pass; the pin's patches differing fails, naming the base's commit; a base
    patch not applied fails."""
    root = tmp_path / "root"
    tree = root / "sgl-workspace" / "sglang"
    tree.mkdir(parents=True)
    (tree / "server.py").write_text("top_p = 1.0\n")
    (root / "opt" / "Megatron-LM").mkdir(parents=True)
    base = root / "opt" / "deepdive-slurm" / "base-patches"
    pinned = root / "opt" / "slime" / "docker" / "patch" / "latest"
    base.mkdir(parents=True)
    pinned.mkdir(parents=True)
    (root / "opt" / "deepdive-slurm" / "base-slime-commit.txt").write_text("06ffdbe22\n")
    patch = (
        "diff --git a/server.py b/server.py\n--- a/server.py\n+++ b/server.py\n"
        "@@ -1 +1 @@\n-top_p = 1.0\n+top_p = 0.9\n"
    )
    (base / "sglang.patch").write_text(patch)
    (pinned / "sglang.patch").write_text(patch)
    subprocess.run(["git", "apply", str(base / "sglang.patch")], cwd=tree, check=True)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-eu"], input=patch_checks(root), capture_output=True, text=True, timeout=60
        )

    same = check()
    assert same.returncode == 0, same.stderr
    (pinned / "sglang.patch").write_text(patch.replace("0.9", "0.95"))
    other = check()
    assert other.returncode == 1
    assert "built with slime 06ffdbe22's patches, which differ from" in other.stderr
    (pinned / "sglang.patch").write_text(patch)
    subprocess.run(["git", "apply", "-R", str(base / "sglang.patch")], cwd=tree, check=True)
    missing = check()
    assert missing.returncode == 1 and "sglang.patch not applied" in missing.stderr
