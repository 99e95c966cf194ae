"""The training image's build decisions, one command each, run with the image's own python3
(standard library only): by `make pin-images` on the pulled base, by `make image` before the
build, by containers/train.def's %post and %test, and by tests/test_containers.py against fake
bases (a directory tree of distributions and patched checkouts).

- `record --image NAME@DIGEST`: what the bare base holds, as JSON on stdout (`make pin-images`
  keeps it in containers/base-record.json): its slime and Megatron-LM commits, SGLang's
  distribution and tree, uvicorn, numpy, each of slime's patches with its hash and whether it is
  applied, whether the pinned slime's patches are the base's, `pip check`, and the problems that
  would fail the build. Checked once, when the base is pulled; the build starts from it.
- `ready RECORD IMAGE`: the record is of IMAGE and names no problem (`make image`, before any
  download).
- `matches RECORD`: the bare base holds what its record says (%post, before anything changes);
  its `pip check` is the baseline of `conflicts`.
- `conflicts RECORD`: `pip check` now; fails on every conflict the base's record did not have
  (what this project's additions caused), and lists the base's own. slime's own Dockerfile
  leaves conflicts in its image (it uninstalls a package SGLang declares, force-reinstalls forks
  with --no-deps, downgrades numpy): they are slime's, not a defect of this build.
- `patches TREE PATCH...`: each patch, in the order slime's Dockerfile applies them, is applied in
  TREE (it reverses cleanly on the files no later patch touches).
- `sglang TREE VERSION`: the SGLang distribution is the patched tree's (`TREE/python`, as
  slime's image installs it editable), at the pinned version or a development version (slime's
  dev images report `0.0.0.dev1+g…`, THUDM/slime#1455): the tree and the patches decide.
- `uvicorn PROJECT`: the installed uvicorn is the minor version
  PROJECT/services/serving/uvicorn_internals.py was written for (UVICORN_MINOR).

`--python PY` checks another interpreter's environment (`pip --python`), `--root DIR` reads the
base's paths under DIR: what the tests use for a fake base.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DEV_VERSION = re.compile(r"^0\.0\.0\.dev\d+(\+.*)?$")
RECORD_FORMAT = 1
# where slime's docker/Dockerfile (624b824) leaves its checkouts and SGLang's tree
SLIME, MEGATRON, SGLANG_TREE = "root/slime", "root/Megatron-LM", "sgl-workspace/sglang"
PATCH_DIR = "docker/patch/latest"
# the Dockerfile's order: the SGLang patches (line 140), then Megatron's (lines 118-133)
SGLANG_PATCHES = (
    "sglang.patch",
    "sglang-top_p.patch",
    "sglang-release_hicache.patch",
    "sglang-pull_weights.patch",
    "sglang-deterministic.patch",
)
MEGATRON_PATCHES = ("megatron.patch", "megatron-sglang-aligned.patch")


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv`'s result; a program that is not installed is a failed run (127), not a crash."""
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)  # noqa: S603
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not installed")


def pip_check(python: str | None) -> list[str]:
    """`pip check`'s conflict lines (its exit status is 1 when there are any)."""
    target = ["--python", python] if python else []
    result = run(sys.executable, "-m", "pip", *target, "check", "--no-color")
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
    result = run(python or sys.executable, "-c", probe, name)
    if result.returncode != 0:
        raise SystemExit(f"train_checks: reading {name}'s metadata failed: {result.stderr}")
    found: dict[str, str] | None = json.loads(result.stdout)
    return found


def unapplied(tree: Path, patches: list[Path]) -> list[str]:
    """The patches (in order; absent files skipped) that are not applied in TREE: each must
    reverse cleanly on the files no later patch touches (a later one changed the rest again)."""
    present = [patch for patch in patches if patch.is_file()]
    missing = []
    for index, patch in enumerate(present):
        later = [
            f"--exclude={line.removeprefix('+++ b/')}"
            for after in present[index + 1 :]
            for line in after.read_text().splitlines()
            if line.startswith("+++ b/")
        ]
        if run("git", "apply", "--reverse", "--check", *later, str(patch), cwd=tree).returncode:
            missing.append(patch.name)
    return missing


def sglang_problem(found: dict[str, str] | None, tree: Path, version: str) -> str | None:
    if found is None:
        return "no sglang distribution: is the base slime's image?"
    url = json.loads(found["direct_url"]) if found["direct_url"] else {}
    location = url.get("url", "").removeprefix("file://") or found["location"]
    if not Path(location).resolve().is_relative_to(tree.resolve()):
        return (
            f"sglang {found['version']} is installed from {location}, not from the patched tree "
            f"{tree}: slime's patches are not what runs"
        )
    if found["version"] != version and not DEV_VERSION.match(found["version"]):
        return (
            f"sglang {found['version']} from {tree}: containers/pins.env says {version} (a "
            "development build, 0.0.0.devN, is accepted: the tree decides)"
        )
    return None


def commit(checkout: Path) -> str | None:
    result = run(
        "git", "-c", f"safe.directory={checkout}", "-C", str(checkout), "rev-parse", "HEAD"
    )
    return result.stdout.strip() if result.returncode == 0 else None


def pinned_patches(slime: Path, pin: str, repository: str | None) -> tuple[str, list[str]]:
    """Whether the pinned slime's patches are the base's own slime's: ("same" | "differ" |
    "unknown", the files that differ or why it is unknown). The base's clone is fetched from
    REPOSITORY when it lacks the pin, as %post does."""
    git = ["git", "-c", f"safe.directory={slime}", "-C", str(slime)]
    if run(*git, "cat-file", "-e", f"{pin}^{{commit}}").returncode != 0:
        fetched = run(*git, "fetch", "--quiet", repository, pin) if repository else None
        if fetched is None or fetched.returncode != 0:
            why = fetched.stderr.strip() if fetched else "no repository to fetch it from"
            return "unknown", [f"the base's slime clone lacks {pin}: {why}"]
    result = run(*git, "diff", "--name-only", "HEAD", pin, "--", PATCH_DIR)
    if result.returncode != 0:
        return "unknown", [result.stderr.strip()]
    files = sorted(Path(line).name for line in result.stdout.splitlines() if line)
    return ("differ", files) if files else ("same", [])


def record(args: argparse.Namespace) -> dict[str, Any]:
    """What the bare base under ROOT holds, and what in it would fail the build."""
    root: Path = args.root
    slime, megatron, tree = root / SLIME, root / MEGATRON, root / SGLANG_TREE
    problems: list[str] = []
    if shutil.which("git") is None:
        problems.append("no git in the base: its checkouts and patches cannot be read")
    for checkout in (slime, megatron):
        if not (checkout / ".git").exists():
            problems.append(f"no {checkout} checkout: is the base slime's image?")
    slime_commit, megatron_commit = commit(slime), commit(megatron)
    if megatron_commit != args.megatron_commit:
        problems.append(
            f"its Megatron-LM is at {megatron_commit}, containers/pins.env says "
            f"{args.megatron_commit}"
        )
    patch_dir = slime / PATCH_DIR
    order = [(tree, SGLANG_PATCHES), (root / MEGATRON, MEGATRON_PATCHES)]
    not_applied = [
        name
        for checkout, names in order
        for name in unapplied(checkout, [patch_dir / name for name in names])
    ]
    problems += [
        f"{name} is not applied in the base: it is not the slime image it says it is"
        for name in not_applied
    ]
    patches = {
        path.name: {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "applied": path.name not in not_applied,
        }
        for path in sorted(patch_dir.glob("*.patch"))
    }
    state, files = pinned_patches(slime, args.slime_commit, args.slime_repository)
    if state != "same":
        problems.append(
            f"it was built with slime {slime_commit}'s patches; {args.slime_commit}'s "
            f"{'differ: ' if state == 'differ' else 'are unknown: '}{', '.join(files)}"
        )
    found = distribution(args.python, "sglang")
    problem = sglang_problem(found, tree, args.sglang_version)
    problems += [problem] if problem else []
    numpy = distribution(args.python, "numpy")
    if numpy is None or not numpy["version"].startswith("1."):
        problems.append(f"numpy {numpy['version'] if numpy else 'none'}: Megatron needs 1.x")
    uvicorn = distribution(args.python, "uvicorn")
    return {
        "format": RECORD_FORMAT,
        "image": getattr(args, "image", None),
        "slime": {"commit": slime_commit, "pin": args.slime_commit, "pin_patches": state},
        "megatron": {"commit": megatron_commit, "pin": args.megatron_commit},
        "sglang": {k: found[k] for k in ("version", "location")} if found else None,
        "uvicorn": uvicorn["version"] if uvicorn else None,
        "numpy": numpy["version"] if numpy else None,
        "patches": patches,
        "pip_check": pip_check(args.python),
        "problems": problems,
    }


def read_record(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"train_checks: no {path}: run 'make pin-images' where the registry is reachable "
            "(it pulls the base once and records what it holds)"
        ) from None
    except ValueError as error:
        raise SystemExit(f"train_checks: {path} is not a base record: {error}") from None
    if not isinstance(found, dict) or found.get("format") != RECORD_FORMAT:
        raise SystemExit(
            f"train_checks: {path} is not a base record of format {RECORD_FORMAT}: "
            "run 'make pin-images' again"
        )
    return found


def ready(path: Path, image: str) -> None:
    found = read_record(path)
    if found["image"] != image:
        raise SystemExit(
            f"train_checks: {path} records {found['image']}, containers/pins.env names {image}: "
            "run 'make pin-images' again"
        )
    problems = found["problems"]
    if problems:
        listed = "\n  ".join(str(problem) for problem in problems)
        raise SystemExit(
            f"train_checks: {image} would fail the build ({path}, 'make pin-images'):\n  {listed}"
        )
    print(f"train_checks: {image} recorded in {path}, no problem named")


def matches(path: Path, args: argparse.Namespace) -> None:
    wanted = read_record(path)
    found = record(args)
    found["image"] = wanted["image"]  # the build cannot see its base's digest
    differ = sorted(
        key for key in wanted.keys() | found.keys() if wanted.get(key) != found.get(key)
    )
    if differ:
        lines = "\n  ".join(
            f"{key}: {found.get(key)!r}, recorded {wanted.get(key)!r}" for key in differ
        )
        raise SystemExit(f"train_checks: the base is not what {path} recorded:\n  {lines}")
    conflicts = len(found["pip_check"])
    print(f"train_checks: the base holds what {path} recorded ({conflicts} pip check conflicts)")


def conflicts(python: str | None, path: Path) -> None:
    before = set(read_record(path)["pip_check"])
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


def patches(tree: Path, paths: list[Path]) -> None:
    missing = unapplied(tree, paths)
    if missing:
        raise SystemExit(
            f"train_checks: {', '.join(missing)} not applied in {tree}: the base is not the slime "
            "image it says it is"
        )
    print(f"train_checks: {sum(path.is_file() for path in paths)} patch(es) applied in {tree}")


def sglang(python: str | None, tree: Path, version: str) -> None:
    found = distribution(python, "sglang")
    problem = sglang_problem(found, tree, version)
    if problem or found is None:
        raise SystemExit(f"train_checks: {problem}")
    print(f"train_checks: sglang {found['version']} from the patched tree {tree}")


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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train_checks", description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="check this interpreter's environment")
    parser.add_argument("--root", type=Path, default=Path("/"), help="the base's / (a fake base)")
    commands = parser.add_subparsers(dest="command", required=True)
    base = argparse.ArgumentParser(add_help=False)  # what `record` and `matches` compare with
    for flag in ("--slime-commit", "--megatron-commit", "--sglang-version"):
        base.add_argument(flag, required=True)
    base.add_argument("--slime-repository", help="fetch the pinned slime from here if absent")
    commands.add_parser("record", parents=[base]).add_argument("--image", required=True)
    commands.add_parser("matches", parents=[base]).add_argument("file", type=Path)
    ready_command = commands.add_parser("ready")
    ready_command.add_argument("file", type=Path)
    ready_command.add_argument("image")
    commands.add_parser("conflicts").add_argument("file", type=Path)
    patch_command = commands.add_parser("patches")
    patch_command.add_argument("tree", type=Path)
    patch_command.add_argument("paths", type=Path, nargs="*")
    tree = commands.add_parser("sglang")
    tree.add_argument("tree", type=Path)
    tree.add_argument("version")
    commands.add_parser("uvicorn").add_argument("project", type=Path)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.command == "record":
        print(json.dumps(record(args), indent=1, sort_keys=True))
    elif args.command == "matches":
        matches(args.file, args)
    elif args.command == "ready":
        ready(args.file, args.image)
    elif args.command == "conflicts":
        conflicts(args.python, args.file)
    elif args.command == "patches":
        patches(args.tree, args.paths)
    elif args.command == "sglang":
        sglang(args.python, args.tree, args.version)
    else:
        uvicorn(args.python, args.project)


if __name__ == "__main__":
    main()
