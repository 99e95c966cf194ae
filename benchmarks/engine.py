"""Local engine throughput: tokens/s for 1, 8 and 32 concurrent requests decoded as one batch,
measured side by side in one run (the tiny world-trained policy, one CPU thread)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any


def run(new_tokens: int = 64) -> dict[str, Any]:
    import torch

    from deepdive.local.engine import GenerationRequest, LocalEngine
    from deepdive.local.model import new_model, train_tokenizer
    from deepdive.offline.build import write_world
    from deepdive.offline.world import WorldSizes

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        write_world(Path(tmp), 0, WorldSizes())
        lines = (Path(tmp) / "demonstrations.jsonl").read_text().splitlines()
        tokenizer = train_tokenizer([json.loads(line)["response"] for line in lines], 2048)
    engine = LocalEngine(new_model(tokenizer), tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Who made the jade lens made in 1777?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    engine.generate_batch([GenerationRequest(ids, 8, seed=0)])  # warm-up
    rows = []
    for batch in (1, 8, 32):
        requests = [GenerationRequest(ids, new_tokens, seed=i) for i in range(batch)]
        started = time.perf_counter()
        results = engine.generate_batch(requests)
        seconds = time.perf_counter() - started
        tokens = sum(len(r.ids) for r in results)
        rows.append(
            {
                "batch": batch,
                "tokens": tokens,
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 1),
            }
        )
    return {"parameters": sum(p.numel() for p in engine.model.parameters()), "runs": rows}
