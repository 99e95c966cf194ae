"""How many tokens a model folder can be served with, read from its config.json, and the rule
that every episode fits in it.

SGLang refuses a request whose input reaches its context length, or whose input plus
max_new_tokens passes it (python/sglang/srt/managers/tokenizer_manager.py,
`_validate_one_request`, SGLang 0.5.15.post1). Our rollout keeps prompt + response within
`max_context_len` (deepdive/generate.py), so every request is served only when
`max_context_len` <= the context SGLang serves. Otherwise every turn gets a 400, every episode
is ABORTED and scores 0.

What SGLang serves: `--context-length` when given, else what it derives from config.json
(python/sglang/srt/utils/hf_transformers/common.py, `get_context_length`: the first of
CONTEXT_LENGTH_KEYS, times the rope-scaling factor unless rope_scaling names
original_max_position_embeddings). Under transformers 5.12.1, the version SGLang 0.5.15.post1
pins, the loaded config always carries original_max_position_embeddings in rope_scaling
(measured: a YaRN config.json without it loads with it), so the derived length is the key's
value as it stands. A `--context-length` above the derived one makes SGLang refuse to start
unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (python/sglang/srt/configs/model_config.py,
`_derive_context_length`).

YaRN (rope_scaling with a factor) extends what the model can attend to, but slime trains a
dense model through Megatron-LM 1dcf0da, whose --position-embedding-type offers no yarn
(megatron/training/arguments.py, line 1671; slime's model provider passes that type,
slime/backends/megatron_utils/model_provider.py, line 210): the trainer would compute every
log-probability with plain RoPE while SGLang samples with YaRN. So a config.json with YaRN is
refused for a model without multi-latent attention (whose Megatron path takes yarn).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.base.errors import ConfigError

# SGLang's order of preference (python/sglang/srt/utils/hf_transformers/common.py)
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
SGLANG_DEFAULT_CONTEXT = 2048  # get_context_length when no key is present
OVERRIDE_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@dataclass(frozen=True)
class ModelContext:
    """What a model's config.json says about its context."""

    source: str  # the config.json it was read from
    key: str  # the config key SGLang derives its context length from ("" = none: its default)
    derived: int  # the context SGLang serves without --context-length
    rope_type: str  # "" without rope scaling; "yarn", "linear", "dynamic", ...
    rope_factor: float  # 1.0 without rope scaling
    extended: int  # what rope scaling would extend the context to (= derived without it)

    def describe(self) -> str:
        where = f"{self.key} {self.derived}" if self.key else f"SGLang's default {self.derived}"
        scaling = (
            f", rope_scaling {self.rope_type} x{self.rope_factor:g} (up to {self.extended})"
            if self.rope_type
            else ""
        )
        return f"{self.source}: {where}{scaling}"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys (a multimodal config nests them in text_config)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else dict(config)


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a Hugging Face model folder has one)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: unreadable ({error})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return document


def _rope_scaling(config: dict[str, Any]) -> tuple[str, float, int | None]:
    """(type, factor, original length) of the config's rope scaling; ("", 1.0, None) without."""
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict):  # transformers 5 writes rope_parameters instead
        parameters = config.get("rope_parameters")
        scaling = parameters if isinstance(parameters, dict) and "factor" in parameters else None
    if not scaling:
        return "", 1.0, None
    kind = str(scaling.get("rope_type") or scaling.get("type") or "")
    if kind in ("", "default"):
        return "", 1.0, None
    factor = scaling.get("factor", 1.0)
    original = scaling.get("original_max_position_embeddings")
    return (
        kind,
        float(factor) if isinstance(factor, int | float) else 1.0,
        int(original) if isinstance(original, int) else None,
    )


def model_context(config: dict[str, Any], source: str = "config.json") -> ModelContext:
    """A model's context as SGLang derives it and as rope scaling would extend it."""
    text = text_config(config)
    key = next(
        (name for name in CONTEXT_LENGTH_KEYS if isinstance(text.get(name), int | float)), ""
    )
    derived = int(text[key]) if key else SGLANG_DEFAULT_CONTEXT
    kind, factor, original = _rope_scaling(text)
    extended = int(factor * (original or derived)) if kind else derived
    return ModelContext(source, key, derived, kind, factor, max(extended, derived))


def served_context(model: ModelContext, configured: int, key: str) -> int:
    """The context SGLang serves given `configured` (its --context-length; 0 = none), refusing
    one it would not start with."""
    if configured and configured > model.derived:
        raise ConfigError(
            f"{key}: {configured} is more than the {model.derived} tokens SGLang derives from "
            f"{model.describe()}; SGLang refuses to start with it (unless {OVERRIDE_ENV}=1, "
            "which serves positions the model was not trained for)"
        )
    return configured or model.derived


def check_episode_fits(
    model: ModelContext,
    served: int,
    max_context_len: int,
    max_response_len: int,
    context_key: str,
    response_key: str,
) -> None:
    """Every request of an episode is one SGLang serves: prompt + response within `served`."""
    if max_context_len > served:
        raise ConfigError(
            f"{context_key}: {max_context_len} tokens per episode, but SGLang serves "
            f"{served} ({model.describe()}): every turn would be refused (HTTP 400) and every "
            f"episode ABORTED with reward 0; set it to at most {served}"
        )
    if max_response_len > max_context_len:
        raise ConfigError(
            f"{response_key}: {max_response_len} response tokens cannot fit in "
            f"{context_key} = {max_context_len} (prompt + response); set it to at most "
            f"{max_context_len}"
        )


def check_trainer_rope(model: ModelContext, multi_latent_attention: bool) -> None:
    """SGLang samples with the rope Megatron trains with."""
    if model.rope_type == "yarn" and not multi_latent_attention:
        raise ConfigError(
            f"{model.describe()}: SGLang would sample with YaRN rope scaling, but "
            "Megatron-LM 1dcf0da trains this (non-MLA) model with plain RoPE "
            "(--position-embedding-type has no yarn): every log-probability would disagree. "
            "Remove rope_scaling from config.json and keep the context within "
            f"{model.derived} tokens"
        )
