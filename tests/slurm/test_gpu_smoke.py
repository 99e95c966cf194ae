"""The GPU acceptance kit's own parts on a CPU: choosing steps, running each in its own process
with a deadline, every failure path (no GPU, slime missing, a step that raises, hangs, dies or
checks nothing), the exit code, `make gpu-smoke` with no arguments, and the kit as one real
2-node Slurm job. The old kit (scripts/gpu_smoke.py) printed "3/3 checks passed" and exited 0
here, with 0 GPUs and slime missing; `make gpu-smoke` stopped at its arguments."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pytest_httpserver import HTTPServer

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH, REWARD_FUNCTION_PATH
from services.base.errors import ConfigError
from slurm.backends.slime.args import DYNAMIC_FILTERS, FILTERS
from slurm.config import ExperimentConfig, ServicesTable
from slurm.node.environment import CpuGrant, GpuGrant, gpus_given
from slurm.smoke.context import SmokeContext, here
from slurm.smoke.image import (
    IMPORT_CLOSURE,
    Needed,
    cpu_check,
    gpu_check,
    host_memory_check,
    import_checks,
    node_memory_gib,
    readable_check,
    user_check,
)
from slurm.smoke.report import Check, StepResult
from slurm.smoke.runner import gather, run_node
from slurm.smoke.search import search_check
from slurm.smoke.steps import STEPS, Step, plan, select
from tests.helpers import (
    DEEPDIVE,
    RESULT_URL,
    SERPER_KEY,
    TINY_JOB,
    answer_search_and_read,
    clean_environment,
    internet_tools,
    slime_recipe,
    submitted_job_id,
)

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = "tests.slurm.test_gpu_smoke"


# -- steps the runner tests run in their own processes (imported there by name) ---------------


def passing_step(context: SmokeContext) -> list[Check]:
    return [Check("something", True, f"checked on node {context.node.node}")]


def raising_step(context: SmokeContext) -> list[Check]:
    raise RuntimeError("the step broke: no such device")


def empty_step(context: SmokeContext) -> list[Check]:
    return []


def hanging_step(context: SmokeContext) -> list[Check]:
    time.sleep(600)
    return []


def dying_step(context: SmokeContext) -> list[Check]:
    os.kill(os.getpid(), 9)
    return []


def kit_step(number: int, function: str, timeout_s: float = 120) -> Step:
    return Step(number, f"t{number}", "a test step", "about 1 s", timeout_s, "every node",
                f"{HERE}:{function}")  # fmt: skip


def smoke(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEEPDIVE, "smoke", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env or {**os.environ, "PYTHONPATH": str(ROOT)},
    )


# -- choosing steps ------------------------------------------------------------------------


def test_the_steps_come_in_the_issue_order_each_with_its_expected_runtime() -> None:
    assert [step.name for step in STEPS] == ["image", "nccl", "ray", "sglang", "slime", "local"]
    assert [step.number for step in STEPS] == [1, 2, 3, 4, 5, 6]
    shown = plan(list(STEPS))
    for step in STEPS:
        assert step.expected in shown and step.expected.startswith("about ")
        assert step.timeout_s > 0


def test_only_picks_steps_by_number_or_name_in_the_kits_order() -> None:
    assert [step.number for step in select("")] == [1, 2, 3, 4, 5, 6]
    assert [step.number for step in select("6,1")] == [1, 6]
    assert [step.name for step in select("local, image")] == ["image", "local"]
    assert [step.number for step in select("2,nccl")] == [2]
    with pytest.raises(ConfigError, match=r"no step '9' \(the steps: 1 or image, 2 or nccl"):
        select("1,9")


# -- step 1's checks -------------------------------------------------------------------------


def test_the_gpus_slurm_gave_are_read_from_its_variables() -> None:
    assert gpus_given({"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "4"}).count == 4
    assert gpus_given({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1,2"}).count == 3
    assert gpus_given({"CUDA_VISIBLE_DEVICES": "2,3"}).count == 2
    assert gpus_given({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}).count == 0
    assert gpus_given({"CUDA_VISIBLE_DEVICES": ""}).count == 0
    assert gpus_given({"SLURM_JOB_ID": "7"}).count is None
    assert "asked for no GPU" in gpus_given({"SLURM_JOB_ID": "7"}).describe()
    assert gpus_given({}).describe() == "not in a Slurm job, CUDA_VISIBLE_DEVICES unset"


def grant(**values: str) -> GpuGrant:
    return gpus_given({"SLURM_JOB_ID": "7", **values})


def test_zero_gpus_is_a_failure_that_says_no_gpu() -> None:
    check = gpu_check(0, "torch 2.x, CUDA none", grant(), 0, None)
    assert not check.ok
    assert check.detail.startswith("no GPU: torch.cuda.device_count() is 0")


def test_torch_must_see_exactly_the_gpus_slurm_gave() -> None:
    assert not gpu_check(4, "b", grant(SLURM_GPUS_ON_NODE="8"), 0, 8).ok
    assert "Slurm gave 8" in gpu_check(4, "b", grant(SLURM_GPUS_ON_NODE="8"), 0, 8).detail
    # GPUs torch sees in a job that asked for none belong to someone else
    assert not gpu_check(2, "b", grant(), 0, 2).ok
    assert not gpu_check(4, "b", grant(SLURM_GPUS_ON_NODE="4"), 8, 4).ok  # slurm.gpus_per_node
    assert gpu_check(4, "b", grant(SLURM_GPUS_ON_NODE="4"), 4, 4).ok
    assert gpu_check(2, "b", gpus_given({}), 0, 2).ok  # outside Slurm: the driver's count
    assert not gpu_check(1, "b", gpus_given({}), 0, 2).ok


def test_an_affinity_smaller_than_asked_fails_step_one() -> None:
    """What srun 22.05-23.02 without --cpus-per-task gives under core binding: one core."""
    check = cpu_check(CpuGrant(slurm=64, affinity=1), configured=64)
    assert not check.ok
    assert check.detail.startswith("the task's affinity holds 1 CPU(s), 64 asked")
    assert cpu_check(CpuGrant(slurm=0, affinity=1), configured=8).ok is False  # here, no Slurm
    assert cpu_check(CpuGrant(slurm=8, affinity=8), configured=8).ok
    assert cpu_check(CpuGrant(slurm=2, affinity=16), configured=0).ok  # task/none: more is fine
    assert cpu_check(CpuGrant(slurm=0, affinity=4), configured=0).detail.endswith("none asked")


def test_a_node_with_less_memory_than_the_host_estimate_fails_step_one(
    world: dict[str, Path],
) -> None:
    """The recipe's node needs about 536 GiB (CPU Adam, slime's actor and reference backups)."""
    config = slime_recipe(world)
    small = host_memory_check(config, 512.0)
    assert not small.ok and "about 536 GiB needed, 512 GiB on this node" in small.detail
    assert host_memory_check(config, 2048.0).ok
    assert node_memory_gib() > 0  # /proc/meminfo, or the cgroup's limit
    local = host_memory_check(ExperimentConfig(), node_memory_gib())
    assert local.ok and local.detail.endswith("(no model to estimate)")


def test_root_is_refused_and_a_normal_user_passes() -> None:
    assert not user_check(0).ok
    assert "root" in user_check(0).detail
    assert user_check(4242).ok


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every user may enter (pytest's own are private, which the check would name)."""
    folder = Path(tempfile.mkdtemp(prefix="smoke-readable-"))
    folder.chmod(0o755)
    if readable_check([folder], []).ok is False:
        pytest.skip(f"{tempfile.gettempdir()} is not open to other users here")
    yield folder
    shutil.rmtree(folder)


def test_an_unreadable_file_or_an_untraversable_folder_is_named(open_folder: Path) -> None:
    tmp_path = open_folder
    tree = tmp_path / "opt" / "slime"
    (tree / "slime").mkdir(parents=True)
    (tree / "slime" / "ok.py").write_text("")
    secret = tree / "slime" / "private.py"
    secret.write_text("")
    for folder in (tmp_path, tmp_path / "opt", tree, tree / "slime"):
        folder.chmod(0o755)
    assert readable_check([tmp_path / "opt"], [tree]).ok
    secret.chmod(0o600)
    check = readable_check([tmp_path / "opt"], [tree])
    assert not check.ok and f"{secret} is not readable by other users (mode 600)" in check.detail
    secret.chmod(0o644)
    (tmp_path / "opt").chmod(0o700)  # what /root is: nobody else gets in
    check = readable_check([], [tree])
    assert not check.ok and f"{tmp_path / 'opt'} is not traversable" in check.detail
    (tmp_path / "opt").chmod(0o755)
    assert readable_check([], [tree]).ok
    assert "does not exist" in readable_check([tmp_path / "missing"], []).detail


def searching(tmp_path: Path, tools: dict[str, Any], probe: bool = True) -> SmokeContext:
    """A context whose experiment searches with `tools`, its keys in an env file (with the
    proxy variables emptied: this host's own settings never reach the fakes)."""
    env = tmp_path / "keys.env"
    env.write_text("".join(f"{key}={value}\n" for key, value in clean_environment().items()))
    env.chmod(0o600)
    services = ServicesTable(env_file=str(env), tools=tools, egress_probe=probe)
    return here(dataclasses.replace(ExperimentConfig(), services=services), tmp_path / "kit")


def test_a_real_search_from_the_node_passes_naming_the_providers_and_the_time(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    answer_search_and_read(httpserver)
    url = httpserver.url_for("").rstrip("/")
    check = search_check(searching(tmp_path, internet_tools(url, url)))
    assert check.ok and not check.skipped, check.detail
    assert re.fullmatch(
        r"serper and jina answered this node in \d+\.\d\d s \(read result 1, no proxy set\)",
        check.detail,
    )
    # one search and one read, through a tool server that had the env file's key
    assert [request.path for request, _ in httpserver.log] == ["/search", f"/{RESULT_URL}"]
    assert httpserver.log[0][0].headers["X-API-KEY"] == SERPER_KEY


def test_a_key_serper_refuses_fails_the_search_naming_serper_and_401_never_the_key(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(
        {"message": f"Unauthorized: {SERPER_KEY}", "statusCode": 401}, status=401
    )
    url = httpserver.url_for("").rstrip("/")
    check = search_check(searching(tmp_path, internet_tools(url, url)))
    assert not check.ok and check.name == "search"
    assert "the egress probe's search through serper failed (no proxy set)" in check.detail
    assert "serper: HTTP 401" in check.detail and SERPER_KEY not in check.detail
    assert check.line().startswith("[FAILED] search: ")


def test_the_offline_world_or_no_probe_skips_the_search_and_a_skip_is_no_pass(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    offline = search_check(context(tmp_path))  # the default [services.tools]: offline
    assert offline.skipped and offline.ok  # fails nothing
    assert offline.line().startswith("[skipped] search: the offline world")
    url = httpserver.url_for("").rstrip("/")
    off = search_check(searching(tmp_path, internet_tools(url, url), probe=False))
    assert off.skipped and off.detail == "services.egress_probe = false"
    assert httpserver.log == []  # nothing was asked of the upstream
    # a step whose checks were all skipped checked nothing
    assert not StepResult(1, "image", 0, 1.0, [offline]).ok
    assert StepResult(1, "image", 0, 1.0, [offline]).why() == "checked nothing"
    assert StepResult(1, "image", 0, 1.0, [offline, Check("user", True, "uid 1")]).ok


def test_a_missing_module_or_function_fails_naming_it() -> None:
    checks = import_checks(
        (
            Needed("json", "dumps", "a present one"),
            Needed("json", "no_such_function", "a renamed one"),
            Needed("no_such_package_of_slime.ray", "", "a missing one"),
        )
    )
    assert [check.ok for check in checks] == [True, False, False]
    assert "has no no_such_function" in checks[1].detail
    assert "No module named 'no_such_package_of_slime'" in checks[2].detail


def test_the_image_check_imports_the_hooks_the_launcher_names() -> None:
    """The closure checks the very paths slime is given (deepdive.rollout_settings), split where
    slime's load_function splits them, so moving a hook cannot leave the check on the old path."""
    paths = (GENERATE_FUNCTION_PATH, REWARD_FUNCTION_PATH)
    hooks = tuple(item for item in IMPORT_CLOSURE if item.name in paths)
    assert [item.name for item in hooks] == list(paths)
    assert [check.ok for check in import_checks(hooks)] == [True, True]


def test_the_image_check_imports_every_filter_the_launcher_can_name() -> None:
    """Each of the three --dynamic-sampling-filter-path values (slurm/backends/slime/args.py),
    not only the default one: a config that drops failed groups names another function."""
    named = {f"{FILTERS}.{name}" for name in DYNAMIC_FILTERS.values()}
    filters = tuple(item for item in IMPORT_CLOSURE if item.name in named)
    assert {item.name for item in filters} == named
    assert all(check.ok for check in import_checks(filters))


def test_step_one_here_fails_naming_no_gpu_and_the_missing_slime(tmp_path: Path) -> None:
    result = smoke("--only", "image", "--folder", str(tmp_path / "kit"))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "[FAILED] GPUs: no GPU: torch.cuda.device_count() is 0" in out
    assert "[FAILED] import slime.ray.placement_group.create_placement_groups: " in out
    assert "No module named 'slime'" in out
    assert "[FAILED] step 1 image" in out
    assert "[skipped] search: the offline world" in out  # the default experiment's tools
    assert "gpu-smoke: FAILED: step(s) 1 image (GPUs: no GPU" in out
    assert "[ok] step" not in out
    report = orjson.loads((tmp_path / "kit" / "report.json").read_bytes())
    assert report["ok"] is False


def test_a_slime_without_the_functions_train_py_needs_is_named(tmp_path: Path) -> None:
    # a slime of another commit: the modules import, the functions slime 624b824 has do not
    for module in ("slime/__init__", "slime/ray/__init__", "slime/ray/placement_group"):
        path = tmp_path / "site" / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def create_placement_group():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"}
    result = smoke("--only", "image", "--folder", str(tmp_path / "kit"), env=env)
    assert result.returncode == 1
    assert "slime.ray.placement_group (" in result.stdout
    assert "has no create_placement_groups" in result.stdout


def test_make_gpu_smoke_with_no_arguments_runs_step_one_and_fails_naming_no_gpu(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        ["make", "--no-print-directory", "gpu-smoke", f"SMOKE_PYTHON={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "usage:" not in out and "required" not in out  # not at its arguments
    assert "== step 1 image" in out
    assert "gpu-smoke: FAILED: step(s) 1 image (GPUs: no GPU" in out
    assert "not run: 2 nccl, 3 ray, 4 sglang, 5 slime, 6 local" in out


def test_a_used_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    result = smoke("--only", "image", "--folder", str(tmp_path))
    assert result.returncode == 2
    assert "is not empty: the kit needs a fresh folder" in result.stderr


# -- the runner --------------------------------------------------------------------------------


def context(tmp_path: Path) -> SmokeContext:
    return here(ExperimentConfig(), tmp_path / "kit")


def test_a_step_that_raises_fails_with_its_message_and_stops_the_next(tmp_path: Path) -> None:
    said: list[str] = []
    steps = [kit_step(1, "raising_step"), kit_step(2, "passing_step")]
    results = run_node(steps, context(tmp_path), say=said.append)
    assert [(r.number, r.ran, r.ok) for r in results] == [(1, True, False), (2, False, False)]
    assert results[0].error == "RuntimeError: the step broke: no such device"
    text = "\n".join(said)
    assert "[FAILED] the step raised: RuntimeError: the step broke: no such device" in text
    assert "not run: 2 t2" in text
    report = orjson.loads((tmp_path / "kit" / "report.json").read_bytes())
    assert report["ok"] is False


def test_keep_going_runs_the_rest_and_still_fails(tmp_path: Path) -> None:
    steps = [kit_step(1, "raising_step"), kit_step(2, "passing_step")]
    results = run_node(steps, context(tmp_path), keep_going=True, say=lambda _: None)
    assert [(r.ran, r.ok) for r in results] == [(True, False), (True, True)]
    assert results[1].checks == [Check("something", True, "checked on node 0")]
    assert orjson.loads((tmp_path / "kit" / "report.json").read_bytes())["ok"] is False


def test_only_passing_steps_pass(tmp_path: Path) -> None:
    results = run_node([kit_step(1, "passing_step")], context(tmp_path), say=lambda _: None)
    assert [r.ok for r in results] == [True]
    assert orjson.loads((tmp_path / "kit" / "report.json").read_bytes())["ok"] is True


def test_a_step_that_checks_nothing_has_not_passed(tmp_path: Path) -> None:
    results = run_node([kit_step(1, "empty_step")], context(tmp_path), say=lambda _: None)
    assert not results[0].ok and results[0].why() == "checked nothing"


def test_a_hung_step_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    results = run_node(
        [kit_step(1, "hanging_step", timeout_s=5)], context(tmp_path), say=lambda _: None
    )
    assert not results[0].ok
    assert results[0].error is not None
    assert results[0].error.startswith("did not finish within 5 s (expected about 1 s); stopped")


def test_a_step_whose_process_dies_is_a_failure_saying_so(tmp_path: Path) -> None:
    results = run_node([kit_step(1, "dying_step")], context(tmp_path), say=lambda _: None)
    assert results[0].error == "its process was killed by SIGKILL and left no result"


def test_a_result_that_never_comes_from_another_node_names_the_node(tmp_path: Path) -> None:
    kit = context(tmp_path)
    two = dataclasses.replace(kit, node=dataclasses.replace(kit.node, num_nodes=2))
    mine = StepResult(1, "t1", 0, 1.0, [Check("x", True, "y")])
    found = gather(kit_step(1, "passing_step", timeout_s=0.2), two, mine, margin_s=0.3)
    assert [(r.node, r.ok) for r in found] == [(0, True), (1, False)]
    assert found[1].error is not None
    assert found[1].error.startswith("node 1's result of step t1: no answer after")


# -- the kit as one Slurm job ------------------------------------------------------------------


def test_dry_run_shows_the_kits_job_and_its_steps(tmp_path: Path) -> None:
    result = smoke(
        str(TINY_JOB), "--dry-run", "--only", "image,nccl", "--set", f'run.folder="{tmp_path}"'
    )
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --job-name=tiny-smoke" in result.stdout
    assert "#SBATCH --nodes=2" in result.stdout
    assert "#SBATCH --time=30" in result.stdout  # 300 s + 900 s of deadlines, and 10 min
    assert "1 image   about 30 s" in result.stdout and "2 nccl" in result.stdout
    assert "3 ray" not in result.stdout


def test_a_job_whose_steps_need_a_model_is_refused_without_one(tmp_path: Path) -> None:
    folder = f'run.folder="{tmp_path}"'
    result = smoke(str(TINY_JOB), "--dry-run", "--only", "1,4", "--set", folder)
    assert result.returncode == 2
    assert "--model: step(s) 4 sglang need a Hugging Face model folder" in result.stderr
    assert "none was given" in result.stderr
    result = smoke(str(TINY_JOB), "--only", "5", "--model", str(tmp_path), "--set", folder)
    assert result.returncode == 2 and f"{tmp_path} has no config.json" in result.stderr


@pytest.mark.slow
def test_the_kit_runs_as_one_two_node_slurm_job(job_env: dict[str, str], tmp_path: Path) -> None:
    env = {**job_env, "PYTHONPATH": str(ROOT)}
    result = smoke(
        str(TINY_JOB), "--only", "image,nccl", "--keep-going", "--wait",
        "--set", f'run.folder="{tmp_path / "run"}"', env=env, timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    job = submitted_job_id(result.stdout)
    folder = tmp_path / "run" / "smoke" / job
    report = orjson.loads((folder / "report.json").read_bytes())
    by_check = {
        (r["number"], r["node"], c["name"]): c for r in report["results"] for c in r["checks"]
    }
    for node in (0, 1):  # each node checked itself, as a task of the job
        assert by_check[(1, node, "GPUs")]["detail"].startswith("no GPU")
        assert by_check[(2, node, "NCCL on this node")]["detail"].startswith("no GPU")
        assert by_check[(2, node, "NCCL across nodes")]["detail"] == (
            "not run: no GPU on node(s) 0, 1"
        )
        # gloo needs no GPU: 4 processes on the 2 nodes, over the node's interface
        [gloo] = [c for (n, k, name), c in by_check.items() if (n, k) == (2, node)
                  and name.startswith("gloo over ")]  # fmt: skip
        assert gloo["ok"], gloo
        assert "over 4 rank(s)" in gloo["detail"] and "result correct" in gloo["detail"]
    text = (folder / "report.txt").read_text()
    assert "gpu-smoke: FAILED: step(s) 1 image, 2 nccl" in text
    assert f"job {job} failed" in result.stderr
