"""Write the model architecture presets (slurm/backends/slime/presets.json) from slime's own model scripts.

slime's scripts/models/NAME.sh each set one bash array, MODEL_ARGS, with Megatron's architecture
arguments for a Hugging Face model (layers, sizes, heads, query groups, vocabulary, rope base,
norm and bias choices). The launcher needs the same arguments to train a model and to convert
its checkpoints; this script reads those arrays (a `${VAR:-default}` takes its default) for the
dense Qwen2.5 and Qwen3 models and records each with the file and commit it came from.

usage: python scripts/slime_presets.py SLIME_CHECKOUT COMMIT > slurm/backends/slime/presets.json
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

DENSE = re.compile(r"^(qwen2\.5-\d+(\.\d+)?B|qwen3-\d+(\.\d+)?B(-Instruct-2507)?)$")


SOURCED = re.compile(
    r"^((?:[A-Z_][A-Z0-9_]*=\S+\s+)*)source\s.*?([\w.-]+\.sh)\"?\s*$", re.MULTILINE
)


def model_args(script: str, folder: Path, values: dict[str, str] | None = None) -> list[str]:
    """MODEL_ARGS of one script; one that only sources another with a few variables set
    (`MODEL_ARGS_ROTARY_BASE=5000000 source …/qwen3-4B.sh`) reads that one with them."""
    values = dict(values or {})
    found = re.search(r"MODEL_ARGS=\((.*?)\)", script, re.DOTALL)
    if found is None:
        sourced = SOURCED.search(script)
        if sourced is None:
            raise ValueError("no MODEL_ARGS=( ... ) array and no script it sources")
        for assignment in sourced.group(1).split():
            key, _, value = assignment.partition("=")
            values[key] = value
        return model_args((folder / sourced.group(2)).read_text(), folder, values)
    body = re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}",
        lambda match: values.get(match.group(1), match.group(2)),
        found.group(1),
    )
    if "$" in body:
        raise ValueError(f"an expansion without a default: {body!r}")
    return shlex.split(body, comments=True)


def main() -> None:
    checkout, commit = Path(sys.argv[1]), sys.argv[2]
    presets = {}
    for path in sorted((checkout / "scripts" / "models").glob("*.sh")):
        name = path.stem
        if DENSE.match(name):
            presets[name] = {
                "source": f"THUDM/slime@{commit}:scripts/models/{path.name}",
                "args": model_args(path.read_text(), path.parent),
            }
    json.dump(
        {"generated_by": "scripts/slime_presets.py", "presets": presets}, sys.stdout, indent=1
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
