"""One rank of the kit's all-reduce (`python -m slurm.smoke.collective_worker ...`).

It joins the process group through node 0's TCP store, checks one all-reduce's result (every
rank contributes rank + 1), times ITERATIONS all-reduces of the payload after a warm-up, and
rank 0 writes what it measured: the slowest rank's time per call, so the figure is the
collective's, not one fast rank's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from slurm.run_folder import write_json


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m slurm.smoke.collective_worker")
    parser.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--local-rank", type=int, default=0)
    parser.add_argument("--master", required=True, help="ADDRESS:PORT of rank 0's store")
    parser.add_argument("--bytes", type=int, required=True, help="the payload of each call")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--result", type=Path, required=True, help="rank 0 writes it")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist

    nccl = args.backend == "nccl"
    device = torch.device("cuda", args.local_rank) if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)

    def settle() -> None:
        if nccl:
            torch.cuda.synchronize(device)

    dist.init_process_group(
        args.backend,
        init_method=f"tcp://{args.master}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout_s),
    )
    probe = torch.full((1024,), float(args.rank + 1), device=device)
    dist.all_reduce(probe)
    expected = args.world * (args.world + 1) / 2
    correct = torch.tensor([1.0 if bool(torch.all(probe == expected)) else 0.0], device=device)
    dist.all_reduce(correct, op=dist.ReduceOp.MIN)

    payload = torch.ones(max(1, args.bytes // 4), dtype=torch.float32, device=device)
    for _ in range(args.warmup):
        dist.all_reduce(payload)
    settle()
    started = time.perf_counter()
    for _ in range(args.iterations):
        dist.all_reduce(payload)
    settle()
    per_call = torch.tensor([(time.perf_counter() - started) / args.iterations], device=device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    if args.rank == 0:
        write_json(
            args.result,
            {
                "backend": args.backend,
                "world": args.world,
                "bytes": payload.numel() * 4,
                "seconds_per_call": float(per_call.item()),
                "correct": bool(correct.item() == 1.0),
                "iterations": args.iterations,
            },
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
