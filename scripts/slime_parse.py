"""Record what slime's own parser makes of the argv the launcher builds, for every config in
configs/ with backend = "slime" (tests/slurm/golden/slime_parse.json).

slime drops what it does not understand without a word and parses what it does with argparse
types (a "1" where a float was meant, a list cut short, an abbreviation taken for another
flag), so the argv is held to what slime's own code reads from it. This script runs where
slime, Megatron-LM and SGLang import (the training image; or a CPU machine prepared as for
scripts/slime_flags.py, with `--stub torchvision`), builds each config's argv over a small
world of placeholder files (a Qwen2.5-32B-Instruct-shaped config.json, empty data), and
records for each:

- "argv": the launcher's argv, the world's folder written {WORLD};
- "parsed": the namespace slime's parse_args builds before validating it, from slime's own
  functions in its order (`_pre_parse_mode`, `sglang_parse_args`, Megatron-LM's `parse_args`
  with `get_slime_extra_args_provider`, merged Megatron < pre < SGLang: slime/utils/arguments.py,
  lines 1600-1636), each value as JSON holds it (an enum as NAME.member, anything else
  {"repr": ...});
- "unknown_flags": --flags that every one of those parsers left over (slime ignores them);
- "validated": slime's whole `parse_args` (its validation too): "ok", or the error it raised,
  and the namespace it returned.

tests/slurm/test_slime_parse.py compares the launcher's argv with this record and holds
slurm/backends/slime/replay.py (which CI runs over every argv) to the "parsed" namespace.

    PYTHONPATH=SLIME:MEGATRON:. python scripts/slime_parse.py --slime-commit C \\
        --megatron-commit C [--stub torchvision --device-arch 9] \\
        > tests/slurm/golden/slime_parse.json

Without a GPU, Megatron-LM's validate_args stops at the GPU's architecture
(megatron/training/arguments.py, line 927, `get_device_arch_version`); `--device-arch 9`
answers it as a Hopper GPU would, and the record says so ("device_arch_stub").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slime_flags import _json_value, _Stubs

ROOT = Path(__file__).resolve().parents[1]
WORLD = "{WORLD}"
# the files the configs name, made in a scratch folder: what the parse reads of them is
# config.json (slime's parse_args loads it with AutoConfig and compares it with the
# architecture flags) and the --custom-config-path YAML
MODEL_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,  # what slime's scripts/models/qwen2.5-32B.sh says (--norm-epsilon)
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}
FILES = {
    "model/config.json": json.dumps(MODEL_CONFIG),
    "ref/latest_checkpointed_iteration.txt": "release",
    "data/train.jsonl": '{"input_messages": [], "label": "x"}\n',
    "train.sif": "sif",
    "keys.env": "SERPER_API_KEY=x\n",
}
OVERRIDES = [
    f'run.folder="{WORLD}/run"',
    f'slime.model.hf_checkpoint="{WORLD}/model"',
    f'slime.model.ref_load="{WORLD}/ref"',
    f'slime.rollout.prompt_data="{WORLD}/data/train.jsonl"',
    f'container.image="{WORLD}/train.sif"',
    f'services.env_file="{WORLD}/keys.env"',
]
CUSTOM_CONFIG = "deepdive_rollout.yaml"
# one node: its tool server's one worker, its reward server
URLS = {"tools": [["http://10.0.0.1:20010"]], "reward": ["http://10.0.0.1:20011"]}


def make_world(root: Path) -> None:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "keys.env").chmod(0o600)


def slime_configs() -> list[Path]:
    import tomllib

    return [
        path
        for path in sorted((ROOT / "configs").glob("*.toml"))
        if tomllib.loads(path.read_text()).get("run", {}).get("backend") == "slime"
    ]


def launcher_argv(config_file: Path, root: Path) -> list[str]:
    """The argv the launcher builds for `config_file` over the world at `root` (and the YAML
    beside it, which slime reads)."""
    import yaml

    from slurm.backends.slime.args import custom_config, slime_arguments
    from slurm.config import load_experiment

    overrides = [item.replace(WORLD, str(root)) for item in OVERRIDES]
    config = load_experiment(config_file, overrides)
    command = slime_arguments(config, root / CUSTOM_CONFIG)
    tools = tuple(tuple(node) for node in URLS["tools"])
    custom = custom_config(config, tools, tuple(URLS["reward"]))
    (root / CUSTOM_CONFIG).write_text(yaml.safe_dump(custom))
    return command.arguments()


def _namespace(values: dict[str, Any], root: Path) -> dict[str, Any]:
    text = json.dumps({key: _json_value(value) for key, value in sorted(values.items())})
    loaded: dict[str, Any] = json.loads(text.replace(str(root), WORLD))
    return loaded


def slime_parse(argv: list[str], root: Path) -> dict[str, Any]:
    """slime's own parsers over `argv`, as train.py would run them."""
    from megatron.training.arguments import parse_args as megatron_parse_args
    from slime.backends.sglang_utils.arguments import sglang_parse_args
    from slime.utils import arguments

    leftovers: list[list[str]] = []
    parse_known = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        namespace, extras = parse_known(self, *args, **kwargs)
        leftovers.append(list(extras))
        return namespace, extras

    sys.argv = ["train.py", *argv]
    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    try:
        pre = arguments._pre_parse_mode()
        sglang = sglang_parse_args()
        megatron = megatron_parse_args(
            extra_args_provider=arguments.get_slime_extra_args_provider(),
            ignore_unknown_args=True,
        )
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known  # type: ignore[method-assign]
    parsed = {**vars(megatron), **vars(pre), **vars(sglang)}
    flags = [{t for t in extras if t.startswith("--")} for extras in leftovers]
    unknown = sorted(set.intersection(*flags)) if flags else []
    try:
        validated: dict[str, Any] = {"ok": True, "error": None}
        validated["namespace"] = _namespace(vars(arguments.parse_args()), root)
    except (Exception, SystemExit) as error:  # recorded, not hidden
        validated = {"ok": False, "error": f"{type(error).__name__}: {error}", "namespace": {}}
    return {
        "argv": [item.replace(str(root), WORLD) for item in argv],
        "parsed": _namespace(parsed, root),
        "unknown_flags": unknown,
        "validated": validated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime-commit", required=True)
    parser.add_argument("--megatron-commit", required=True)
    parser.add_argument("--stub", default="", help="comma-separated modules to stub (CPU only)")
    parser.add_argument(
        "--device-arch", type=int, default=0, help="CPU only: the GPU architecture to answer"
    )
    args = parser.parse_args()
    stubs = {name for name in args.stub.split(",") if name}
    if stubs:
        sys.meta_path.insert(0, _Stubs(stubs))
    sys.path.insert(0, str(ROOT))
    import sglang

    if args.device_arch:
        import megatron.training.arguments as megatron_arguments

        megatron_arguments.get_device_arch_version = lambda: args.device_arch  # type: ignore[attr-defined]

    records = {}
    with (
        tempfile.TemporaryDirectory(prefix="slime-parse-") as folder,
        contextlib.redirect_stdout(sys.stderr),  # Megatron prints as it validates
    ):
        root = Path(folder)
        make_world(root)
        os.environ.setdefault("WORLD_SIZE", "1")
        # what the launcher gives train.py (slurm/backends/slime/backend.py `environment`) and
        # Megatron's validate_args asserts with tensor parallelism
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        for config_file in slime_configs():
            argv = launcher_argv(config_file, root)
            records[str(config_file.relative_to(ROOT))] = slime_parse(argv, root)
    document = {
        "generated_by": "scripts/slime_parse.py",
        "sources": {
            "slime": args.slime_commit,
            "megatron": args.megatron_commit,
            "sglang": getattr(sglang, "__version__", "?"),
        },
        "stubbed_imports": sorted(stubs),
        "device_arch_stub": args.device_arch or None,
        "world": {"overrides": OVERRIDES, "files": FILES, "urls": URLS},
        "configs": records,
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
