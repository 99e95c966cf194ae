"""The small CPU policy of the embedded default: a byte-level BPE tokenizer trained on the world's
own text, and a tiny Qwen2-architecture causal LM initialised from a config.

The tool-call and chat markers are single special tokens, so the stop at `</tool_call>` is one
token and the model never has to spell the syntax out of byte pieces. Neither a capitalised
word nor a number takes the space before it (GPT-2's split makes " Hukra" and "Hukra" different
tokens), so a name or a year is the same tokens in a sentence, a URL and a JSON string, and
copying the answer from the page into the finish call is a token-for-token copy.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deepdive.protocol import OBSERVATION_CLOSE, OBSERVATION_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    OBSERVATION_OPEN,
    OBSERVATION_CLOSE,
]
# GPT-2's pre-tokenizer split, except that a capitalised word or a number stands alone (see
# above: answers are names and years)
SPLIT_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[a-z]+|[A-Z][a-z]*|\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> Any:
    """A byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",  # noqa: S106 (a token, not a password)
        pad_token="<|endoftext|>",  # noqa: S106
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def new_model(
    tokenizer: Any,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    context: int = 4096,
) -> Any:
    """A tiny Qwen2ForCausalLM with fresh weights (deterministic by seed)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model


def logits_to_keep(model: Any, positions: int) -> dict[str, int]:
    """The forward keyword that projects only the last `positions` onto the vocabulary, where
    the model's forward takes it (transformers' causal LMs do); {} for one that does not,
    which then projects every position."""
    takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": positions} if takes else {}


def default_device() -> str:
    """One GPU when torch sees one, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(path: str | Path, device: str | None = None) -> tuple[Any, Any]:
    """Any local Hugging Face causal-LM folder (ours or a small real model) and its tokenizer,
    on `device` (default: one GPU if present, else the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model: Any = AutoModelForCausalLM.from_pretrained(str(path))  # its stubs mistype .to()
    model.to(device=device or default_device())  # in place, for modules
    model.eval()
    return model, tokenizer
