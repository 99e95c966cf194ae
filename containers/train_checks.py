"""The training image's build decisions, one command each, run by containers/train.def's %post
and %test with the image's own python3 (standard library only), and by tests/test_containers.py
against fake bases (a directory tree of distributions and patched checkouts).

- `baseline FILE`: `pip check` of the bare base (slime's image), before anything is added.
  slime's own Dockerfile leaves conflicts there (it uninstalls a package SGLang declares,
  force-reinstalls forks with --no-deps, downgrades numpy): they are slime's, not a defect of
  this build.
- `conflicts FILE`: `pip check` now; fails on every conflict the baseline did not have (what
  this project's additions caused), and lists the base's own.
- `sglang TREE VERSION`: the SGLang distribution is the patched tree's (`TREE/python`, as
  slime's image installs it editable), at the pinned version or a development version (slime's
  dev images report `0.0.0.dev1+g…`, THUDM/slime#1455): the tree and the patches decide.
- `uvicorn PROJECT`: the installed uvicorn is the minor version
  PROJECT/services/serving/uvicorn_internals.py was written for (UVICORN_MINOR).

`--python PY` (before the command) checks another interpreter's environment (`pip --python`):
what the tests use for a fake base.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

DEV_VERSION = re.compile(r"^0\.0\.0\.dev\d+(\+.*)?$")


def pip_check(python: str | None) -> list[str]:
    """`pip check`'s conflict lines (its exit status is 1 when there are any)."""
    target = ["--python", python] if python else []
    result = subprocess.run(  # noqa: S603 (pip, on this environment)
        [sys.executable, "-m", "pip", *target, "check", "--no-color"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode not in (0, 1):
        raise SystemExit(f"train_checks: pip check failed to run: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    found = sorted(line for line in lines if line and line != "No broken requirements found.")
    if result.returncode == 1 and not found:  # broken, but nothing said: never a silent pass
        raise SystemExit(
            f"train_checks: pip check failed and named nothing: {result.stderr.strip()}"
        )
    return found


def distribution(python: str | None, name: str) -> dict[str, str] | None:
    """A distribution's version, location and direct_url.json in PY's environment."""
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "try:\n"
        "    d = m.distribution(sys.argv[1])\n"
        "except m.PackageNotFoundError:\n"
        "    print('null'); raise SystemExit\n"
        "print(json.dumps({'version': d.version, 'location': str(d.locate_file('')),\n"
        "                  'direct_url': d.read_text('direct_url.json') or ''}))\n"
    )
    result = subprocess.run(  # noqa: S603 (the environment's own interpreter)
        [python or sys.executable, "-c", probe, name], capture_output=True, text=True, check=True
    )
    found: dict[str, str] | None = json.loads(result.stdout)
    return found


def baseline(python: str | None, out: Path) -> None:
    lines = pip_check(python)
    out.write_text("".join(f"{line}\n" for line in lines))
    print(f"train_checks: the base's own pip check: {len(lines)} conflict(s), kept in {out}")
    for line in lines:
        print(f"  base: {line}")


def conflicts(python: str | None, recorded: Path) -> None:
    before = set(recorded.read_text().splitlines())
    now = pip_check(python)
    for line in now:
        if line in before:
            print(f"  the base's own (slime's Dockerfile leaves it): {line}")
    new = [line for line in now if line not in before]
    if new:
        listed = "\n  ".join(new)
        raise SystemExit(
            f"train_checks: what this build added conflicts with the base ({len(new)}):\n  {listed}"
        )
    print(f"train_checks: no new conflict ({len(now)} of the base's own kept)")


def sglang(python: str | None, tree: Path, version: str) -> None:
    found = distribution(python, "sglang")
    if found is None:
        raise SystemExit("train_checks: no sglang distribution: is the base slime's image?")
    url = json.loads(found["direct_url"]) if found["direct_url"] else {}
    source = url.get("url", "").removeprefix("file://")
    location = source or found["location"]
    if not (Path(location).resolve().is_relative_to(tree.resolve())):
        raise SystemExit(
            f"train_checks: sglang {found['version']} is installed from {location}, not from the "
            f"patched tree {tree}: slime's patches are not what runs"
        )
    if found["version"] != version and not DEV_VERSION.match(found["version"]):
        raise SystemExit(
            f"train_checks: sglang {found['version']} from {tree}: containers/pins.env says "
            f"{version} (a development build, 0.0.0.devN, is accepted: the tree decides)"
        )
    print(f"train_checks: sglang {found['version']} from the patched tree {location}")


def uvicorn(python: str | None, project: Path) -> None:
    source = (project / "services" / "serving" / "uvicorn_internals.py").read_text()
    minor = re.search(r'^UVICORN_MINOR = "([0-9.]+)"$', source, re.MULTILINE)
    if minor is None:
        raise SystemExit(f"train_checks: no UVICORN_MINOR in {project}/services/serving")
    found = distribution(python, "uvicorn")
    have = found["version"] if found else "none"
    if not (have == minor.group(1) or have.startswith(minor.group(1) + ".")):
        raise SystemExit(
            f"train_checks: uvicorn {have} is installed, services/serving/uvicorn_internals.py "
            f"was written for {minor.group(1)}.x: the lock's uvicorn must replace the base's"
        )
    print(f"train_checks: uvicorn {have}, the minor the services were written for")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="train_checks", description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="check this interpreter's environment")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("baseline").add_argument("file", type=Path)
    commands.add_parser("conflicts").add_argument("file", type=Path)
    tree = commands.add_parser("sglang")
    tree.add_argument("tree", type=Path)
    tree.add_argument("version")
    commands.add_parser("uvicorn").add_argument("project", type=Path)
    args = parser.parse_args(argv)
    if args.command == "baseline":
        baseline(args.python, args.file)
    elif args.command == "conflicts":
        conflicts(args.python, args.file)
    elif args.command == "sglang":
        sglang(args.python, args.tree, args.version)
    else:
        uvicorn(args.python, args.project)


if __name__ == "__main__":
    main()
