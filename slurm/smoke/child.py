"""One step in a process of its own: `python -m slurm.smoke.child MODULE:FUNCTION CONTEXT RESULT`.

The step's function gets the pickled SmokeContext and returns its checks; whatever it raises
becomes the step's error, with its message (the traceback goes to this process's stderr, the
node's log). The result file is written whole; the parent reads a missing one as a crash.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm.run_folder import write_json
from slurm.smoke.context import SmokeContext
from slurm.smoke.report import Check


def resolve(path: str) -> Callable[[SmokeContext], list[Check]]:
    module, _, name = path.partition(":")
    function: Callable[[SmokeContext], list[Check]] = getattr(importlib.import_module(module), name)
    return function


def describe(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def main(argv: Sequence[str]) -> int:
    function_path, context_path, result_path = argv
    # the parent wrote it a moment ago into the kit's private folder (our own dataclasses)
    context: SmokeContext = pickle.loads(Path(context_path).read_bytes())  # noqa: S301
    result: dict[str, Any] = {"checks": [], "error": None}
    try:
        checks = resolve(function_path)(context)
        result["checks"] = [vars(check) for check in checks]
    except (Exception, SystemExit) as error:
        traceback.print_exc()
        result["error"] = describe(error)
    sys.stdout.flush()
    write_json(Path(result_path), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
