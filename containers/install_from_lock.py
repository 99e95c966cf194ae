"""Install from requirements.lock what an image does not already provide, each package at its
locked version with its hashes, and no other package.

For the training image: its base (slime's SGLang image) brings the CUDA stack, PyTorch, SGLang
and the versions SGLang pins (transformers, for one); reinstalling those at the lock's versions
would break SGLang. What the base lacks (submitit, bm25s, selectolax, ...) comes from the lock,
so it is the same code CI tested. Prints what it kept and what it installed.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# always the lock's, replacing the base's: services/serving/uvicorn_internals.py subclasses
# uvicorn's internals, written for one minor version (train_checks.py uvicorn checks it)
REPLACE = {"uvicorn"}
ENTRY = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def entries(lock: Path) -> list[tuple[str, str, str, list[str]]]:
    """(name, version, marker, hash lines) per pin."""
    found: list[tuple[str, str, str, list[str]]] = []
    for line in lock.read_text().splitlines():
        match = ENTRY.match(line)
        if match:
            found.append((match.group(1), match.group(2), match.group(3) or "", []))
        elif line.strip().startswith("--hash=") and found:
            found[-1][3].append(line.strip().rstrip("\\").strip())
    return found


def main() -> None:
    dry_run = "--dry-run" in sys.argv[1:]  # print what pip would get, install nothing
    lock = Path(next(arg for arg in sys.argv[1:] if arg != "--dry-run"))
    wanted = []
    for name, version, marker, hashes in entries(lock):
        try:
            present: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            present = None
        if present is not None and (name not in REPLACE or present == version):
            note = "" if present == version else f" (the lock has {version})"
            print(f"kept {name} {present}{note}")
            continue
        if present is not None:
            print(f"replacing {name} {present} with the lock's {version}")
        pin = f"{name}=={version}" + (f" ; {marker}" if marker else "")
        wanted.append(" \\\n    ".join([pin, *hashes]))
    if not wanted:
        return
    if dry_run:
        print("would install:\n" + "\n".join(wanted))
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write("\n".join(wanted) + "\n")
    subprocess.check_call(  # noqa: S603 (pip, with the lock's own pins)
        [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps",
         "--require-hashes", "-r", requirements.name]
    )  # fmt: skip
    print(f"installed {len(wanted)} package(s) from {lock}")


if __name__ == "__main__":
    main()
