"""The backend seam, checked from the code itself (as tests/test_layering.py checks the layers):

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
_INVENTED_URL = re.compile(r"://[^/\s'\"]*\.invalid\b")  # RFC 2606's name for "nowhere"


def _sources(root: Path) -> Iterator[tuple[str, ast.AST]]:
    for path in sorted(root.glob("*/**/*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/", 1)[0] in PACKAGES:
            yield relative, ast.parse(path.read_text(encoding="utf-8"), filename=relative)


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
