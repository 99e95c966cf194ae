"""`deepdive submit | status | logs | cancel`: the command-line faces of the launcher."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import tomli_w

from services.base.cli import add_overrides_argument
from services.base.errors import ConfigError
from services.base.files import atomic_write_bytes
from slurm.config import ExperimentConfig, load_experiment
from slurm.launch.preflight import missing_inputs, require_inputs
from slurm.run_folder import RunFolder, private_folder


def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", type=Path, help="the experiment file (configs/cluster-local.toml)"
    )
    parser.add_argument("--nodes", type=int, help="override slurm.nodes")
    add_overrides_argument(parser, "--set slurm.time_min=30 --set local.grpo.steps=5")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sbatch script and the training command; submit nothing",
    )
    parser.add_argument(
        "--allow-image-mismatch",
        action="store_true",
        help="submit although container.image was built from other code than this launcher's",
    )


def run_submit(args: argparse.Namespace) -> None:
    from slurm.backends import build_backend
    from slurm.launch.submit import sbatch_script, submit
    from slurm.view.status import remember_job

    overrides = list(args.overrides)
    if args.nodes is not None:
        overrides.append(f"slurm.nodes={args.nodes}")
    config = load_experiment(args.config, overrides)
    backend = build_backend(config)
    for warning in backend.check():
        print(f"warning: {warning}", file=sys.stderr)
    missing = missing_inputs(config)
    if config.container.image and not any(item.startswith("container.") for item in missing):
        from slurm.launch.image_labels import check_image

        check_image(
            config.container.apptainer, config.container.image, args.allow_image_mismatch, warn
        )
    run = config.run_folder
    if args.dry_run:
        attempt = run.attempt("JOB-RESTART")
        print("# the sbatch script (submitit renders it; JOB is the job id)")
        print(sbatch_script(config))
        print("# the training command node 0 runs, in RUN/attempts/JOB-RESTART")
        print(backend.describe(attempt))
        if missing:  # what a real submission refuses: printed after what would run
            for item in missing:
                print(f"missing: {item}", file=sys.stderr)
            raise ConfigError(
                f"{len(missing)} input(s) missing (above): a real submission refuses until "
                "they exist"
            )
        return
    require_inputs(config)
    if run.finished.exists():
        print(f"{run.root} finished already ({run.finished}): nothing to submit")
        return
    check_same_run(config, run)
    with undone_if_refused(run):
        private_folder(run.root)
        private_folder(run.submitit)
        atomic_write_bytes(run.config, tomli_w.dumps(config.as_dict()).encode())
        job_id = submit(config)
    run.record_job({"job_id": job_id, "t": time.time(), "nodes": config.slurm.nodes})
    remember_job(job_id, run.root)
    resume = backend.resume_point()
    print(f"submitted job {job_id}: {config.slurm.nodes} node(s), backend {config.run.backend}")
    print(f"  run folder  {run.root}")
    if resume:
        print(f"  resumes     from {resume}")
    print(f"  node logs   {run.attempts}/{job_id}-0/node-K.log")
    print(f"  status      deepdive status {run.root}")
    print(f"  logs        deepdive logs {run.root} --node 0 --follow")


@contextlib.contextmanager
def undone_if_refused(run: RunFolder) -> Iterator[None]:
    """A submission sbatch refuses leaves the run folder as it found it: a new folder is
    removed, an existing one gets its config back and loses the pickles written for the job."""
    from slurm.launch.submit import SubmissionRefused

    existed = run.root.exists()
    config = run.config.read_bytes() if run.config.is_file() else None
    before = set(run.submitit.rglob("*")) if run.submitit.is_dir() else set()
    try:
        yield
    except SubmissionRefused:
        if not existed:
            shutil.rmtree(run.root, ignore_errors=True)
        else:
            if config is not None:
                atomic_write_bytes(run.config, config)
            else:
                run.config.unlink(missing_ok=True)
            written = set(run.submitit.rglob("*")) - before if run.submitit.is_dir() else set()
            for path in sorted(written, reverse=True):  # files before their folders
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        raise


def warn(message: str) -> None:
    print(f"deepdive: warning: {message}", file=sys.stderr)


def check_same_run(config: ExperimentConfig, run: RunFolder) -> None:
    """A run folder that holds checkpoints continues only the run it was started with."""
    from slurm.backends import check_continues

    if run.config.is_file():
        check_continues(config, load_experiment(run.config), run.root)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder, or the id of a job submitted from it")
    parser.add_argument("--json", action="store_true", help="one JSON object")


def run_status(args: argparse.Namespace) -> None:
    from slurm.launch.scheduler import job_state
    from slurm.view.status import agent_line, find_run, run_status

    status = run_status(find_run(args.run), job_state)
    if args.json:
        # node numbers are the keys of "nodes": JSON keys are strings
        print(orjson.dumps(status.as_dict(), option=orjson.OPT_NON_STR_KEYS).decode())
        return
    state = status.state or ("FINISHED" if status.finished else "not queued")
    print(f"run       {status.run}")
    print(f"job       {status.job_id or '-'} ({state})")
    print(f"attempt   {status.attempt or '-'} ({status.attempts} so far)")
    print(f"phase     {status.phase or '-'}")
    for node, phase in sorted(status.nodes.items()):
        print(f"  node {node}  {phase}")
    step = "-" if status.step is None else str(status.step)
    reward = "-" if status.reward is None else f"{status.reward:.3f}"
    print(f"step      {step} (reward {reward})")
    agent = agent_line(status.agent)
    if agent:
        print(f"agent     {agent} (per episode)")
    checkpoint = "-" if status.checkpoint is None else f"step {status.checkpoint}"
    print(
        f"checkpoint {checkpoint}"
        + (f" (a requeue now redoes {status.redo})" if status.redo else "")
    )
    print(f"finished  {'yes' if status.finished else 'no'}")
    if status.requeue:
        print(f"requeue   {status.requeue}")
    if status.warning:
        print(f"warning   {status.warning}")
    for failure in status.failures:
        print(f"FAILED    node {failure['node']} during {failure['phase']}: {failure['error']}")


def add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder, or the id of a job submitted from it")
    parser.add_argument("--node", type=int, default=0, help="which node (default 0)")
    parser.add_argument("--attempt", help="which attempt (JOB-RESTART; default the newest)")
    parser.add_argument(
        "--follow", action="store_true", help="keep printing, into newer attempts too"
    )


def run_logs(args: argparse.Namespace) -> None:
    from slurm.view.status import find_run

    run = find_run(args.run)
    attempt = run.attempt(args.attempt) if args.attempt else run.latest_attempt()
    if attempt is None or not attempt.root.is_dir():
        raise ConfigError(f"{run.root}: no attempt has started yet")
    path = attempt.node_log(args.node)
    if not path.is_file() and not args.follow:
        raise ConfigError(f"{path}: no log (does the job have a node {args.node}?)")
    offset = _print_from(path, 0)
    while args.follow:
        time.sleep(0.5)
        offset = _print_from(path, offset)
        newer = run.latest_attempt()
        if not args.attempt and newer is not None and newer.root != attempt.root:
            attempt, path, offset = newer, newer.node_log(args.node), 0
            print(f"--- attempt {newer.root.name} ---", flush=True)


def _print_from(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return offset
    sys.stdout.write(data.decode("utf-8", errors="replace"))
    sys.stdout.flush()
    return offset + len(data)


def add_cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder, or the id of a job submitted from it")


def run_cancel(args: argparse.Namespace) -> None:
    from slurm.launch.scheduler import cancel
    from slurm.view.status import find_run

    run = find_run(args.run)
    jobs = run.submitted_jobs()
    if not jobs:
        raise ConfigError(f"{run.root}: no job was submitted for this run")
    job_id = str(jobs[-1]["job_id"])
    cancel(job_id)
    print(f"cancelled job {job_id} ({run.root}); its checkpoints stay: submit again to resume")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="the experiment file the checkpoints belong to")
    parser.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        metavar="PATH|latest",
        help="a model folder, a training checkpoint, or latest (repeat to compare several)",
    )
    parser.add_argument("--data", type=Path, required=True, help="prompt rows (deepdive convert)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per question (pass@K)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--questions", type=int, default=0, help="the first N only (0: all)")
    parser.add_argument("--out", type=Path, help="where results go (default RUN/eval/TIME)")
    add_overrides_argument(parser, "--set local.rollout.max_turns=8")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the checkpoints, how each is served and the services; evaluate nothing",
    )


def run_eval(args: argparse.Namespace) -> None:
    from rich.console import Console

    from slurm.backends import build_backend
    from slurm.launch.evaluate import evaluate, read_rows

    config = load_experiment(args.config, args.overrides)
    if args.samples < 1:
        raise ConfigError(f"--samples: expected at least 1, got {args.samples}")
    if args.temperature < 0:
        raise ConfigError(f"--temperature: expected >= 0, got {args.temperature}")
    backend = build_backend(config)
    engine = backend.eval_engine()
    checkpoints = [engine.resolve(spec) for spec in args.checkpoint]
    rows = read_rows(args.data)
    if args.questions:
        rows = rows[: args.questions]
    out = args.out or config.run_folder.root / "eval" / time.strftime("%Y%m%d-%H%M%S")
    if args.dry_run:
        served = engine.description
        print(f"{len(rows)} questions x {args.samples} samples from {args.data}, into {out}")
        for checkpoint in checkpoints:
            print(f"  {checkpoint.name}: {checkpoint.path} ({checkpoint.kind}), served by {served}")
        for spec in backend.services():  # each config file as it would be written
            arguments = shlex.join(spec.arguments(Path(f"{spec.name}.toml")))
            print(f"  service {spec.name}: python -m services {arguments} --host 127.0.0.1")
            print(textwrap.indent(spec.config_text() or "# the defaults\n", "    "), end="")
        return
    console = Console()
    evaluate(config, checkpoints, rows, args.samples, args.temperature, out, console)
    console.print(f"results: {out / 'results.jsonl'}, summary: {out / 'summary.json'}")
    console.print(f"episodes: deepdive trajectories {out} (--html {out / 'episodes.html'})")


def add_trajectories_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", type=Path, help="a run folder (deepdive run / submit) or a `deepdive eval` --out"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="only this training step's episodes")
    which.add_argument("--last", action="store_true", help="only the newest step's episodes")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep matching episodes (repeat: all must match): reward=1, status=aborted, "
        "tool=open, text=WORDS, step=N, checkpoint=NAME, id=ID",
    )
    parser.add_argument(
        "--limit", type=int, default=20, help="episodes printed on the terminal (default 20)"
    )
    parser.add_argument("--unfold", action="store_true", help="print observations in full")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write one self-contained page instead (plots, a filterable list of episodes)",
    )


def run_trajectories(args: argparse.Namespace) -> None:
    from rich.console import Console

    from slurm.view.trajectories import Where, load_episodes, read_stats, select

    wheres = [Where.parse(term) for term in args.where]
    episodes = load_episodes(args.run)
    chosen = select(episodes, wheres, args.step, args.last)
    if args.html is None:
        from slurm.view.trajectory_terminal import print_episodes

        print_episodes(chosen, Console(), max(0, args.limit), args.unfold)
        return
    from slurm.view.trajectory_page import render_page

    page = render_page(f"deepdive trajectories: {args.run}", chosen, episodes, read_stats(args.run))
    atomic_write_bytes(args.html, page.encode())
    print(
        f"{args.html}: {len(chosen)} of {len(episodes)} episodes; open it with: "
        f"xdg-open {args.html}"
    )
