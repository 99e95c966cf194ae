"""The layers of the house, checked from the code itself, so that a new import cannot quietly
undo them:

    slurm/      the launcher: may import everything below
      node/     what runs inside the job on every node: the ground floor, importing of the
                launcher only itself and slurm/run_folder.py (the config, the backends and the
                bootstrap import node/), so never launch/ or view/, the login node's side
    deepdive/   the RL side: never imports slurm
      deepdive/*.py   the slime side: runs inside slime's Ray actors on the cluster, so never
                      imports the local backend or the offline world
      local/    the CPU backend;  offline/  the offline world;  convert/  `deepdive convert`
    services/   the HTTP services: import nothing of deepdive but deepdive.protocol, and never
                name the launcher (not even as a string to run)
      base/     the base library under everything: imports nothing of the servers beside it,
                of deepdive or of slurm, and names none of them in a string

and only the launcher's one environment module (slurm/node/environment.py) reads SLURM_* variables.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENT_MODULE = "slurm/node/environment.py"
# what slurm/node/ may import of the launcher: itself, and the run folder's paths and notes
GROUND = ("slurm.node", "slurm.run_folder")
_LAUNCHER = re.compile(r"\bslurm(\.|\s|$)")  # the launcher's package named in a string
# a module above the base library named in a string (a module to import later)
_ABOVE_BASE = re.compile(r"\b(deepdive|slurm)\.\w|\bservices\.(?!base\b)\w")


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module an import statement names, anywhere in the file (functions included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for (
                alias
            ) in node.names:  # `from deepdive import command` names deepdive.convert.command
                yield node.lineno, f"{node.module}.{alias.name}"


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _under_any(name: str, packages: tuple[str, ...]) -> bool:
    return any(_under(name, package) for package in packages)


def layer_violations(root: Path) -> list[str]:
    """Every import or string in `root`'s packages that breaks a rule, as `file:line: why`."""
    found: list[str] = []
    for path in sorted(root.glob("*/**/*.py")):
        relative = path.relative_to(root).as_posix()
        package = relative.split("/", 1)[0]
        if package not in ("deepdive", "services", "slurm"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
        module = relative.removesuffix(".py").replace("/", ".")
        slime_side = package == "deepdive" and relative.count("/") == 1
        in_job = _under(module, "slurm.node")
        base = _under(module, "services.base")
        for line, name in _imports(tree):
            where = f"{relative}:{line}"
            if (
                package == "services"
                and _under(name, "deepdive")
                and not _under(name, "deepdive.protocol")
            ):
                found.append(f"{where}: services import {name} (only deepdive.protocol)")
            if package in ("services", "deepdive") and _under(name, "slurm"):
                found.append(f"{where}: {package} imports the launcher ({name})")
            if slime_side and (_under(name, "deepdive.local") or _under(name, "deepdive.offline")):
                found.append(f"{where}: {module} runs inside slime but imports {name}")
            if in_job and (_under(name, "slurm.launch") or _under(name, "slurm.view")):
                found.append(f"{where}: {module} runs inside the job but imports {name}")
            elif in_job and _under(name, "slurm") and not _under_any(name, GROUND):
                found.append(f"{where}: {module} is on the ground floor but imports {name}")
            above_base = name.startswith("services.") or _under(name, "deepdive")
            above_base = above_base or _under(name, "slurm")
            if base and above_base and not _under(name, "services.base"):
                found.append(f"{where}: the base library imports {name}")
        for line, text in _strings(tree):
            if package == "services" and _LAUNCHER.search(text):
                found.append(f"{relative}:{line}: services name the launcher ({text!r})")
            elif base and _ABOVE_BASE.search(text):
                found.append(f"{relative}:{line}: the base library names {text!r}")
            if "SLURM_" in text and relative != ENVIRONMENT_MODULE:
                found.append(f"{relative}:{line}: reads {text!r}; only {ENVIRONMENT_MODULE} may")
    return found


def test_the_house_keeps_its_layers() -> None:
    assert layer_violations(ROOT) == []


def test_the_check_finds_a_deliberate_bad_import(tmp_path: Path) -> None:
    bad = {
        "services/tool_server/leak.py": "from deepdive.reward import reward_func\n",
        "services/late.py": "def f():\n    import deepdive.local.engine\n",
        "services/launch.py": 'COMMAND = ["python", "-m", "slurm.cli", "serve"]\n',
        "deepdive/up.py": "from slurm import cli\n",
        "deepdive/generate.py": "from deepdive.local.engine import LocalEngine\n",
        "deepdive/protocol.py": "from deepdive import offline\n",
        "slurm/launch/submit.py": 'import os\nos.environ["SLURM_JOB_ID"]\n',
        "services/fine.py": "from deepdive.protocol import FINISH\n",
        "slurm/node/environment.py": 'import os\nos.environ["SLURM_NODEID"]\n',
        "services/base/logs.py": "from services.serving.heap import GcCollector\n",
        "services/base/files.py": "def f():\n    from deepdive import protocol\n",
        "services/base/cli.py": 'TOOLS = "services.tool_server.command"\n',
        "services/base/waiting.py": "from services.base.clock import Clock\nimport services.base\n",
        "services/base/clock.py": "from services import base\n",
        "deepdive/new_hook.py": "from deepdive.offline.world import World\n",
        "slurm/node/ports.py": "from slurm.launch.submit import submit\n",
        "slurm/node/phases.py": "from slurm.view import status\n",
        "slurm/node/watch.py": "from slurm.run_folder import read_json\nfrom slurm import config\n",
    }
    for name, text in bad.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = layer_violations(tmp_path)
    assert sorted({item.split(":", 1)[0] for item in found}) == [
        "deepdive/generate.py",
        "deepdive/new_hook.py",
        "deepdive/protocol.py",
        "deepdive/up.py",
        "services/base/cli.py",
        "services/base/files.py",
        "services/base/logs.py",
        "services/late.py",
        "services/launch.py",
        "services/tool_server/leak.py",
        "slurm/launch/submit.py",
        "slurm/node/phases.py",
        "slurm/node/ports.py",
        "slurm/node/watch.py",
    ], found


def test_the_slime_hooks_load_no_web_framework_and_no_local_backend() -> None:
    # What a slime Ray actor imports with --custom-generate-function-path: a fresh interpreter,
    # every module of the slime side (deepdive/*.py) loaded.
    slime_side = sorted(f"deepdive.{path.stem}" for path in (ROOT / "deepdive").glob("*.py"))
    code = (
        f"import sys, {', '.join(slime_side)}\n"
        "heavy = ('starlette', 'prometheus_client', 'uvicorn', 'torch', 'transformers',"
        " 'deepdive.local', 'deepdive.offline', 'slurm')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"


def test_tests_share_helpers_not_each_other() -> None:
    """Tests import shared pieces from tests/helpers.py, tests/hostile.py, tests/browser.py,
    tests/site_proxy.py and tests/node_egress.py (fixtures come from conftest.py through pytest,
    never by import); benchmarks and fakes never import a test."""
    shared = {
        "tests.helpers", "tests.hostile", "tests.browser", "tests.site_proxy", "tests.node_egress",
    }  # fmt: skip
    found = []
    for folder in ("tests", "benchmarks", "fakes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for line, name in _imports(tree):
                if not _under(name, "tests") or name in shared or name == "tests":
                    continue
                if folder == "tests" and any(name.startswith(f"{s}.") for s in shared):
                    continue  # `from tests.helpers import X` also names tests.helpers.X
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert found == []
