"""The run's policy: a tokenizer trained on the world and a tiny model from random weights (or
`model.path`), made once and kept in the run folder."""

from __future__ import annotations

from typing import Any

from deepdive.local.config import LocalRunConfig
from deepdive.local.warm_start import read_demonstrations, tokenizer_texts
from deepdive.protocol import SYSTEM_PROMPTS
from deepdive.run_paths import RunPaths
from services.base.files import atomic_path


def build_policy(config: LocalRunConfig, paths: RunPaths) -> tuple[Any, Any]:
    """The run's base model and tokenizer, made once and kept in the run folder."""
    from transformers.utils import logging as transformers_logging

    from deepdive.local.model import load_model, new_model, train_tokenizer

    transformers_logging.disable_progress_bar()

    if not (paths.base_model / "config.json").is_file():
        if config.model.path:
            model, tokenizer = load_model(config.model.path)
        else:
            demonstrations = read_demonstrations(paths.world / "demonstrations.jsonl")
            system_prompt = SYSTEM_PROMPTS[config.rollout.system_prompt]
            texts = tokenizer_texts(paths.world / "corpus.jsonl", demonstrations, system_prompt)
            tokenizer = train_tokenizer(texts, config.model.vocab_size)
            model = new_model(
                tokenizer,
                seed=config.run.seed,
                hidden=config.model.hidden,
                layers=config.model.layers,
                heads=config.model.heads,
                context=max(4096, config.rollout.max_context_tokens),
            )
        with atomic_path(paths.base_model) as partial:
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
    return load_model(paths.base_model)
