"""The backend seam, checked from the code itself (as tests/test_layering.py checks the layers):

- nothing outside slurm/backends/ asks which backend it is (`config.run.backend == "slime"`,
  `!=`, `in`, a match on it, a table indexed by it): a backend checks its own config, lists its
  own inputs, builds its own command and serves its own checkpoints (slurm/backends/__init__.py);
- no code builds a settings object or a command line on an invented URL (`http://x.invalid`)
  to get at what does not need one: the rollout's knobs stand apart from the services' URLs
  (deepdive.rollout_settings.RolloutKnobs), and slime's argv apart from its YAML.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deepdive", "services", "slurm")
SEAM = "slurm/backends/"
BACKEND_NAMES = ("local", "slime")
_INVENTED_URL = re.compile(r"://[^/\s'\"]*\.invalid\b")  # RFC 2606's name for "nowhere"


def _sources(root: Path) -> Iterator[tuple[str, ast.AST]]:
    for path in sorted(root.glob("*/**/*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/", 1)[0] in PACKAGES:
            yield relative, ast.parse(path.read_text(encoding="utf-8"), filename=relative)


def _is_run_backend(node: ast.AST) -> bool:
    """`<config>.run.backend`: the experiment's backend name."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "backend"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "run"
    )


def _is_backend_name(node: ast.AST) -> bool:
    """`backend`, `x.backend`, `backend.name`, `build_backend(config).name`."""
    if isinstance(node, ast.Name):
        return node.id == "backend"
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "backend":
        return True
    owner = node.value
    return node.attr == "name" and (
        (isinstance(owner, ast.Name) and "backend" in owner.id)
        or (isinstance(owner, ast.Call) and "backend" in ast.unparse(owner.func))
    )


def _branches_on_the_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        named = any(
            isinstance(item, ast.Constant) and item.value in BACKEND_NAMES for item in operands
        )
        return any(_is_run_backend(item) for item in operands) or (
            named and any(_is_backend_name(item) for item in operands)
        )
    if isinstance(node, ast.Match):
        return _is_run_backend(node.subject) or _is_backend_name(node.subject)
    if isinstance(node, ast.Subscript):
        return _is_run_backend(node.slice)
    return False


def backend_branches(root: Path) -> list[str]:
    """Every place outside slurm/backends/ that branches on the backend's name."""
    return [
        f"{relative}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)}"
        for relative, tree in _sources(root)
        if not relative.startswith(SEAM)
        for node in ast.walk(tree)
        if _branches_on_the_backend(node)
    ]


def test_nothing_outside_the_backends_asks_which_backend_it_is() -> None:
    assert backend_branches(ROOT) == []


def test_the_check_finds_each_way_of_asking(tmp_path: Path) -> None:
    bad = {
        "slurm/launch/command.py": 'def f(config):\n    if config.run.backend == "slime":\n        pass\n',
        "slurm/launch/evaluate.py": "def f(saved, config):\n    return saved.run.backend != config.run.backend\n",
        "slurm/launch/preflight.py": 'def f(c):\n    return c.run.backend in ("local",)\n',
        "slurm/smoke/step.py": 'def f(backend):\n    return backend == "local"\n',
        "slurm/view/status.py": 'def f(c):\n    return "slime" == build_backend(c).name\n',
        "slurm/launch/submit.py": "def f(c):\n    match c.run.backend:\n        case _:\n            pass\n",
        "deepdive/x.py": "def f(c, table):\n    return table[c.run.backend]\n",
        # allowed: the seam itself, and a backend of something else (torch.distributed's)
        "slurm/backends/__init__.py": 'def f(c):\n    return c.run.backend == "slime"\n',
        "slurm/smoke/collective_worker.py": 'def f(args):\n    return args.backend == "nccl"\n',
        "slurm/fine.py": 'def f(c):\n    print(f"backend {c.run.backend}")\n',
    }
    for name, text in bad.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = backend_branches(tmp_path)
    assert sorted({item.split(":", 1)[0] for item in found}) == [
        "deepdive/x.py",
        "slurm/launch/command.py",
        "slurm/launch/evaluate.py",
        "slurm/launch/preflight.py",
        "slurm/launch/submit.py",
        "slurm/smoke/step.py",
        "slurm/view/status.py",
    ], found


def invented_urls(root: Path) -> list[str]:
    """Every string constant of the packages that is a URL on an .invalid host."""
    return [
        f"{relative}:{node.lineno}: {node.value!r}"
        for relative, tree in _sources(root)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _INVENTED_URL.search(node.value)
    ]


def test_no_code_invents_a_url_to_get_what_needs_none() -> None:
    assert invented_urls(ROOT) == []


def test_the_check_finds_an_invented_url(tmp_path: Path) -> None:
    bad = {
        "slurm/backends/slime/args.py": 'URL = "http://router.invalid"\n',
        "deepdive/x.py": 'def f():\n    return {"tools": "http://t.invalid:1/"}\n',
        "services/fine.py": 'HELP = "a host named like.invalid is no URL"\n',
    }
    for name, text in bad.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = invented_urls(tmp_path)
    assert sorted(item.split(":", 1)[0] for item in found) == [
        "deepdive/x.py",
        "slurm/backends/slime/args.py",
    ], found
