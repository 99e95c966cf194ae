"""Steps 2-6 of the GPU smoke kit as far as a CPU takes them: each fails naming why on a
machine without a GPU (never "ok"), the parts that need no GPU run for real (gloo over the
node's interface, the bootstrap with Ray and actors with their own runtime envs), and the
pure parts are checked against recorded samples: NCCL's log lines (formats of NCCL 2.x
INFO output: channels over P2P, SHM and the network), the bus bandwidth as nccl-tests
computes it, Ray's view of the nodes, the arguments each child is started with (parsed by
the child's own parser), the slime recipe against slime's reproducibility script and the
launcher's own checks, and the round trip's comparison of checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.config import ExperimentConfig
from slurm.smoke import (
    collective,
    collective_worker,
    ray_probe,
    ray_step,
    sglang_step,
    slime_step,
)
from slurm.smoke.collective import Group, GroupRun
from slurm.smoke.context import here
from tests.helpers import DEEPDIVE, TINY_JOB

ROOT = Path(__file__).resolve().parent.parent.parent
torch = pytest.importorskip("torch")

ONE_NODE_LOG = """\
gpu-a:41807:41807 [0] NCCL INFO Bootstrap : Using eth0:10.1.0.11<0>
gpu-a:41807:41807 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
gpu-a:41807:41913 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:41808:41912 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-a:41807:41913 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:41807:41913 [0] NCCL INFO Connected all rings
"""
TWO_NODE_LOG = """\
gpu-a:5101:5230 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.0.11<0>
gpu-a:5101:5230 [0] NCCL INFO Using network IB
gpu-a:5101:5230 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA
gpu-a:5101:5230 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu-a:5101:5230 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
"""
OLDER_LOG = """\
node:9621:9688 [3] NCCL INFO Channel 05 : 11[3] -> 12[4] via SHM/direct/direct
node:852750:852802 [0] NCCL INFO Channel 00/0 : 0[27000] -> 7[ca000] via P2P/IPC/read
node:852751:852807 [1] NCCL INFO Channel 01/0 : 1[2a000] -> 8[27000] [send] via NET/Socket/0
node:852751:852807 [1] NCCL INFO Using network Socket
"""


def smoke(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEEPDIVE, "smoke", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


# -- step 2: NCCL and gloo ---------------------------------------------------------------------


def test_the_transport_is_read_from_nccls_own_log_lines() -> None:
    assert collective.transports(ONE_NODE_LOG) == Counter({"P2P/CUMEM/read": 3})
    seen = collective.transports(TWO_NODE_LOG)
    assert seen == Counter({"NET/IB/0/GDRDMA": 2, "P2P/CUMEM": 1})
    assert collective.network_transports(seen) == ["NET/IB/0/GDRDMA"]
    assert collective.describe_transports(seen) == "NET/IB/0/GDRDMA x2, P2P/CUMEM x1"
    older = collective.transports(OLDER_LOG)  # "Channel 05 :" and bus ids in the brackets
    assert older == Counter({"SHM/direct/direct": 1, "P2P/IPC/read": 1, "NET/Socket/0": 1})
    assert collective.nccl_facts(ONE_NODE_LOG) == "NCCL 2.21.5+cuda12.4"
    assert collective.nccl_facts(TWO_NODE_LOG + OLDER_LOG) == "network IB/Socket"
    assert collective.transports("NCCL INFO Connected all rings\n") == Counter()


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    algorithm, bus = collective.bus_bandwidth(256 * 2**20, 0.01, 8)
    assert algorithm == pytest.approx(26.8435456)
    assert bus == pytest.approx(26.8435456 * 2 * 7 / 8)
    assert collective.bus_bandwidth(10**9, 1.0, 1) == (1.0, 0.0)
    shown = collective.measured(
        {"world": 2, "bytes": 2**20, "seconds_per_call": 0.001, "correct": True}
    )
    assert shown.startswith("all-reduce of 1 MiB over 2 rank(s): bus bandwidth 1.0 GB/s")


def group(tmp_path: Path, first: int = 2, local: int = 2) -> Group:
    return Group("across", "nccl", first, local, 4, "10.0.0.1:20001", 2**20, tmp_path / "r.json")


def test_each_rank_is_started_with_arguments_its_parser_accepts(tmp_path: Path) -> None:
    command = collective.worker_command("python3", group(tmp_path), 1)
    assert command[:3] == ["python3", "-m", "slurm.smoke.collective_worker"]
    args = collective_worker.parse(command[3:])
    assert (args.backend, args.rank, args.world, args.local_rank) == ("nccl", 3, 4, 1)
    assert (args.master, args.bytes, args.result) == ("10.0.0.1:20001", 2**20, tmp_path / "r.json")


def outcome(
    tmp_path: Path, log: str, codes: list[int | None], result: dict[str, Any] | None
) -> GroupRun:
    """A finished group: `log` is the last rank's output, the others' are empty."""
    paths = []
    for rank, _ in enumerate(codes):
        path = tmp_path / f"across-rank-{rank}.log"
        path.write_text(log if rank == len(codes) - 1 else "")
        paths.append(path)
    return GroupRun(codes, paths, result)


RESULT = {"world": 2, "bytes": 2**20, "seconds_per_call": 0.001, "correct": True}


def test_a_group_passes_only_with_a_transport_in_nccls_log(tmp_path: Path) -> None:
    ok = collective.judged(
        "NCCL on this node", outcome(tmp_path, ONE_NODE_LOG, [0, 0], RESULT), "any"
    )
    assert ok.ok and "transport P2P/CUMEM/read x3" in ok.detail and "NCCL 2.21.5" in ok.detail
    blind = collective.judged("n", outcome(tmp_path, "no channel lines\n", [0, 0], RESULT), "any")
    assert not blind.ok and "shows no transport" in blind.detail
    local = collective.judged("n", outcome(tmp_path, ONE_NODE_LOG, [0, 0], RESULT), "network")
    assert not local.ok and "no network transport between the nodes" in local.detail
    across = collective.judged("n", outcome(tmp_path, TWO_NODE_LOG, [0, 0], RESULT), "network")
    assert across.ok and "NET/IB/0/GDRDMA x2" in across.detail and "network IB" in across.detail
    single = {**RESULT, "world": 1}
    alone = collective.judged("n", outcome(tmp_path, "", [0], single), "any")
    assert alone.ok and "one GPU: a single rank" in alone.detail


def test_a_failed_rank_is_named_with_nccls_warning(tmp_path: Path) -> None:
    log = ONE_NODE_LOG + (
        "gpu-b:77:88 [1] NCCL INFO transport/net_ib.cc:1295 -> 6\n"
        "gpu-b:77:88 [1] NCCL WARN NET/IB : Got completion from peer 10.1.0.12<55921> with "
        "status=12 opcode=1 len=0 vendor err 129 (Send)\n"
    )
    check = collective.judged("n", outcome(tmp_path, log, [0, 1], None), "network")
    assert not check.ok
    assert check.detail.startswith("across-rank-1 exited with status 1 (")
    assert "NCCL WARN NET/IB : Got completion from peer 10.1.0.12<55921> with status=12" in (
        check.detail
    )
    late = collective.judged("n", outcome(tmp_path, "", [None, 0], None), "any")
    assert "across-rank-0 did not finish in time" in late.detail
    wrong = collective.judged(
        "n", outcome(tmp_path, "", [0, 0], {**RESULT, "correct": False}), None
    )
    assert "summed wrong" in wrong.detail


def test_gloo_uses_the_backends_interface_and_refuses_a_loopback_address() -> None:
    assert collective.chosen_interface({"GLOO_SOCKET_IFNAME": "ib0"}, "10.0.0.1") == ("ib0", None)
    _, problem = collective.chosen_interface({}, "127.0.1.1")
    assert problem is not None and "a loopback one: other nodes cannot reach it" in problem
    assert collective.interface_of("127.0.0.1") == "lo"
    # nodes emulated on one host, their loopback address pinned by the experiment
    assert collective.chosen_interface({}, "127.0.0.2", one_host=True) == ("lo", None)
    assert collective.chosen_interface({}, "192.0.2.254")[1] == (
        "no network interface holds the node's address 192.0.2.254"
    )


@pytest.mark.slow
def test_step_two_here_says_no_gpu_for_nccl_and_runs_gloo_for_real(tmp_path: Path) -> None:
    result = smoke("--only", "nccl", "--folder", str(tmp_path / "kit"))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "[FAILED] NCCL on this node: no GPU: the NCCL all-reduce needs one" in out
    assert "[FAILED] NCCL across nodes: not checked: this run has 1 node" in out
    assert "[ok] gloo over " in out and "over 2 rank(s)" in out and "result correct" in out
    assert "gpu-smoke: FAILED: step(s) 2 nccl (NCCL on this node: no GPU" in out


# -- step 3: the bootstrap, Ray and actors -----------------------------------------------------


def ray_node(
    index: int, gpus: float, alive: bool = True, address: str = "10.0.0.1"
) -> dict[str, Any]:
    return {
        "NodeID": f"id{index}",
        "Alive": alive,
        "NodeManagerAddress": address,
        "Resources": {"CPU": 32.0, "GPU": gpus, f"deepdive_node_{index}": 1.0},
    }


def test_ray_must_see_every_node_with_its_resource_and_gpus() -> None:
    checks = ray_probe.node_checks([ray_node(0, 8), ray_node(1, 8)], 2, 8)
    assert [check.ok for check in checks] == [True, True]
    assert "deepdive_node_1 at 10.0.0.1 (8 GPU)" in checks[0].detail
    missing = ray_probe.node_checks([ray_node(0, 8), ray_node(1, 8, alive=False)], 2, 8)
    assert not missing[0].ok and "missing: deepdive_node_1" in missing[0].detail
    short = ray_probe.node_checks([ray_node(0, 8), ray_node(1, 4)], 2, 8)
    assert not short[1].ok and "deepdive_node_1 has 4" in short[1].detail
    none = ray_probe.node_checks([ray_node(0, 0)], 1, 0)
    assert not none[1].ok and none[1].detail.startswith("no GPU")


def answer(node: int, index: int, **changes: Any) -> dict[str, Any]:
    found = {"env": f"{node}.{index}", "node_id": f"id{node}", "gpu_ids": [str(index)]}
    return {**found, "visible": str(index), "host": "h", "pid": 1, **changes}


def test_every_gpu_actor_must_start_on_its_node_with_its_own_runtime_env() -> None:
    expected = [(0, 0), (0, 1), (1, 0), (1, 1)]
    ids = {0: "id0", 1: "id1"}
    answers: dict[tuple[int, int], dict[str, Any] | None] = {key: answer(*key) for key in expected}
    assert ray_probe.actor_check(expected, answers, ids, 2, 300).ok
    late = {**answers, (1, 1): None}
    check = ray_probe.actor_check(expected, late, ids, 2, 300)
    assert not check.ok and "actor 1 on node 1 did not start within 300 s" in check.detail
    assert "worker ports or runtime-env agent" in check.detail
    odd = {
        **answers,
        (0, 1): answer(0, 1, env=None),
        (1, 0): answer(1, 0, node_id="id0", host="gpu-a"),
        (1, 1): answer(1, 1, gpu_ids=[]),
    }
    detail = ray_probe.actor_check(expected, odd, ids, 2, 300).detail
    assert "actor 1 on node 0 lacks its runtime env" in detail
    assert "actor 0 on node 1 ran on another node (gpu-a)" in detail
    assert "actor 1 on node 1 was given GPUs [], not one" in detail


def test_the_probe_is_started_with_arguments_its_parser_accepts(tmp_path: Path) -> None:
    from slurm.config import load_experiment

    config = load_experiment(TINY_JOB, [f'run.folder="{tmp_path}"', "slurm.gpus_per_node=4"])
    context = here(config, tmp_path / "kit")
    command = ray_step.probe_command(context, tmp_path / "probe.json")
    args = ray_probe.parse(command[3:])
    assert (args.nodes, args.gpus_per_node, args.result) == (1, 4, tmp_path / "probe.json")
    step = ray_step.step_config(config, tmp_path / "kit" / "run", {"search": "offline"})
    assert step.run.folder == str(tmp_path / "kit" / "run")
    assert step.services.tools == {"search": "offline"}


@pytest.mark.slow
def test_step_three_runs_the_bootstrap_and_real_ray_actors_and_fails_without_gpus(
    tmp_path: Path,
) -> None:
    result = smoke(
        str(TINY_JOB), "--here", "--only", "ray", "--folder", str(tmp_path / "kit"),
        "--set", f'run.folder="{tmp_path / "run"}"',
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "[ok] bootstrap on node 0: started Ray and the services, ran the probe" in out
    assert "[ok] Ray nodes: 1 alive: deepdive_node_0 at " in out
    assert "[ok] actors with their own runtime env: 1 started, 1 per node" in out
    assert "[FAILED] Ray GPUs: no GPU: slurm.gpus_per_node is 0" in out
    assert "[FAILED] across nodes: not checked: this run has 1 node" in out


# -- step 4: SGLang ----------------------------------------------------------------------------


def test_sglang_and_the_router_are_started_as_slime_needs_them() -> None:
    server = sglang_step.server_command("python3", "/models/q", 2, 20010)
    assert server[:3] == ["python3", "-m", "sglang.launch_server"]
    assert server[server.index("--tp-size") + 1] == "2"
    assert "--enable-memory-saver" in server  # release/resume needs it
    assert server[server.index("--host") + 1] == "127.0.0.1"
    router = sglang_step.router_command("python3", 20011, 20012)
    assert router[:3] == ["python3", "-m", "sglang_router.launch_router"]
    assert router[router.index("--port") + 1] == "20011"


def test_memory_must_fall_at_release_and_come_back_at_resume() -> None:
    assert sglang_step.memory_check(1000, 71000, 3000, 70000).ok
    little = sglang_step.memory_check(1000, 71000, 60000, 70000)
    assert not little.ok and "the release freed too little" in little.detail
    back = sglang_step.memory_check(1000, 71000, 3000, 4000)
    assert not back.ok and "the resume took too little back" in back.detail
    assert not sglang_step.memory_check(1000, 1000, 1000, 1000).ok


def test_the_update_tensor_is_read_from_the_checkpoint_sharded_or_not(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    norm = torch.arange(4, dtype=torch.float32)
    single = tmp_path / "single"
    single.mkdir()
    save_file({sglang_step.PARAMETER: norm}, str(single / "model.safetensors"))
    assert torch.equal(sglang_step.hf_tensor(single, sglang_step.PARAMETER), norm)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"other": norm}, str(sharded / "model-00001-of-00002.safetensors"))
    save_file({sglang_step.PARAMETER: norm * 2}, str(sharded / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"other": "model-00001-of-00002.safetensors",
                            sglang_step.PARAMETER: "model-00002-of-00002.safetensors"}}  # fmt: skip
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(sglang_step.hf_tensor(sharded, sglang_step.PARAMETER), norm * 2)


@pytest.mark.slow
def test_steps_four_five_and_six_say_no_gpu_on_a_cpu(tmp_path: Path) -> None:
    result = smoke("--only", "sglang,slime,local", "--keep-going", "--folder", str(tmp_path))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "[FAILED] SGLang: no GPU: TP 2 needs 2 GPUs on node 0" in out
    assert "[FAILED] slime run: no GPU: the slime run needs one" in out
    assert "[FAILED] local backend step on the GPU: no GPU: the local backend's GPU step" in out
    for step in ("4 sglang", "5 slime", "6 local"):
        assert f"[FAILED] step {step}" in out
    assert "[ok]" not in out


# -- step 5: slime -----------------------------------------------------------------------------

QWEN_05B = {  # Qwen2.5-0.5B-Instruct's config.json, the fields the launcher's checks read
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
}  # fmt: skip


def smoke_recipe(tmp_path: Path, gpus: int = 4) -> ExperimentConfig:
    model = tmp_path / "Qwen2.5-0.5B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN_05B))
    (tmp_path / "ref").mkdir()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("")
    return slime_step.recipe(
        ExperimentConfig(), tmp_path / "run", str(model), str(tmp_path / "ref"), prompts,
        {"search": "offline", "corpus": "c.jsonl"}, gpus,
    )  # fmt: skip


def values(arguments: list[str]) -> dict[str, str]:
    found = {}
    for index, item in enumerate(arguments):
        if item.startswith("--"):
            following = arguments[index + 1] if index + 1 < len(arguments) else "--"
            found[item] = "" if following.startswith("--") else following
    return found


def test_the_slime_recipe_passes_the_launchers_checks_and_follows_slimes_script(
    tmp_path: Path,
) -> None:
    config = smoke_recipe(tmp_path)
    check_slime(config)  # what `deepdive submit` refuses, the kit's run would too
    argv = values(slime_arguments(config, tmp_path / "c.yaml").arguments())
    # slime's scripts/run-qwen2.5-0.5B-reproducibility.sh (624b824), where this run keeps it
    reference = {
        "--rollout-num-gpus-per-engine": "1", "--colocate": "", "--calculate-per-token-loss": "",
        "--rollout-max-response-len": "1024", "--advantage-estimator": "grpo",
        "--use-kl-loss": "", "--kl-loss-type": "low_var_kl", "--eps-clip": "0.2",
        "--eps-clip-high": "0.28", "--optimizer": "adam", "--lr": "1e-06",
        "--lr-decay-style": "constant", "--weight-decay": "0.1", "--adam-beta1": "0.9",
        "--adam-beta2": "0.98", "--sglang-mem-fraction-static": "0.7",
        "--use-dynamic-batch-size": "", "--max-tokens-per-gpu": "9216",
        "--attention-dropout": "0.0", "--hidden-dropout": "0.0",
        "--accumulate-allreduce-grads-in-fp32": "", "--attention-softmax-in-fp32": "",
        "--attention-backend": "flash", "--rollout-shuffle": "", "--apply-chat-template": "",
    }  # fmt: skip
    for flag, value in reference.items():
        assert argv.get(flag) == value, (flag, argv.get(flag))
    assert float(argv["--rollout-temperature"]) == 1.0
    assert float(argv["--kl-loss-coef"]) == 0.0 and float(argv["--entropy-coef"]) == 0.0
    # this run's own: the node's GPUs (slime's default is 8), our hooks, the last rollout saved
    assert argv["--num-gpus-per-node"] == "4" and argv["--actor-num-gpus-per-node"] == "4"
    assert argv["--custom-generate-function-path"] == GENERATE_FUNCTION_PATH
    assert argv["--num-rollout"] == argv["--save-interval"] == str(slime_step.ROLLOUTS)
    assert config.slurm.nodes == 1 and config.services.host == "127.0.0.1"
    assert config.services.tools["corpus"] == "c.jsonl" and config.run.backend == "slime"
    # each flag once, whatever the builder emits itself
    flags = [item for item in slime_arguments(config, tmp_path / "c.yaml").arguments()
             if item.startswith("--")]  # fmt: skip
    assert len(flags) == len(set(flags))


def test_a_conversion_is_one_process_even_in_a_job_of_several_tasks() -> None:
    base = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "PYTHONPATH": "/site"}
    environment = slime_step.conversion_environment(["/opt/slime", "/opt/Megatron-LM"], base, 20005)
    # slime's tools/convert_hf_to_torch_dist.py (lines 93-95) reads WORLD_SIZE, RANK and
    # LOCAL_RANK first, Slurm's task variables only when they are unset
    assert (environment["WORLD_SIZE"], environment["RANK"], environment["LOCAL_RANK"]) == (
        "1", "0", "0",
    )  # fmt: skip
    assert environment["MASTER_PORT"] == "20005" and environment["MASTER_ADDR"] == "127.0.0.1"
    assert environment["PYTHONPATH"] == "/opt/slime:/opt/Megatron-LM:/site"


def test_the_round_trip_must_keep_every_tensor_bit_for_bit(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    original = {"model.norm.weight": torch.ones(4), "model.embed_tokens.weight": torch.ones(8, 4)}
    first = {**original, "lm_head.weight": torch.ones(8, 4)}
    assert slime_step.covers("c", original, first).ok
    assert "and 1 more, e.g. a tied lm_head" in slime_step.covers("c", original, first).detail
    lost = slime_step.covers("c", original, {"model.norm.weight": torch.ones(4)})
    assert not lost.ok and "missing model.embed_tokens.weight" in lost.detail
    reshaped = slime_step.covers("c", original, {**first, "model.norm.weight": torch.ones(5)})
    assert not reshaped.ok and "model.norm.weight (5,) (was (4,))" in reshaped.detail
    assert slime_step.same_tensors("r", first, {k: v.clone() for k, v in first.items()}).ok
    nudged = {**first, "model.norm.weight": torch.ones(4) + 1e-3}
    changed = slime_step.same_tensors("r", first, nudged)
    assert not changed.ok and "1 of 3 tensors changed: model.norm.weight" in changed.detail
    cast = {**first, "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}
    assert not slime_step.same_tensors("r", first, cast).ok
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(first, str(folder / "model.safetensors"))
    assert set(slime_step.load_tensors(folder)) == set(first)
    with pytest.raises(FileNotFoundError, match=r"holds no \.safetensors file"):
        slime_step.load_tensors(tmp_path)
