"""A requeue that works for a job inside an image: submitit's warning signal and its
`scontrol requeue`, kept away from what the image cannot survive.

submitit asks Slurm to signal the job before its time limit (sbatch's `--signal`), catches the
signal in every task, and on node 0 calls `NodeJob.checkpoint`, then runs
`scontrol requeue JOB` from that task. Inside an Apptainer image two things break that:

- Slurm sends the signal to every process of the job step. Apptainer's unprivileged default
  mounts the image with squashfuse_ll, a process of the step: USR2 (submitit's default) ends it,
  and the image vanishes under the running job. The launcher asks for SIGURG instead, whose
  default action is to ignore it, so only submitit's handler reacts (squashfuse, Ray, uvicorn,
  torch and Apptainer's own Go processes leave it alone). submitit reads the signal's name
  from SUBMITIT_PREEMPT_SIGNAL in the job's environment; sbatch gets its number (Slurm 22.05
  knows no name "URG").
- The image has no Slurm client. Every task finds a stand-in `scontrol` first on its PATH
  (RUN/submitit/bin/scontrol, on the run folder every node sees): for `requeue` of its own job
  it writes a note into the attempt folder (requeue-asked.json) and exits 0; anything else goes
  to a real scontrol further on the PATH, if there is one. The batch script, on the host, runs
  the host's `scontrol requeue` after srun has returned (every node has stopped, nothing was
  signalled, the image was never pulled away) when that note is there, and writes Slurm's
  answer beside it (requeue-answer.json), which `deepdive status` shows.

A requeue nobody asked for cannot happen: the note is written only when submitit asks for its
own job, lives in the attempt's own folder (JOB-RESTART: a new attempt starts without one), and
the batch script reads it only when srun returned (a cancelled job's batch shell is killed
before it gets there). The same path runs without an image, so every requeue ends the same way.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

from slurm.node.environment import JOB_ID_VARIABLE as JOB
from slurm.node.environment import RESTART_COUNT_VARIABLE as RESTART
from slurm.run_folder import REQUEUE_ANSWER as ANSWER
from slurm.run_folder import REQUEUE_ASKED as ASKED
from slurm.run_folder import RunFolder

PREEMPT_SIGNAL = signal.SIGURG
SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # read by submitit when it is imported, in the job
SIGNAL_NAME = PREEMPT_SIGNAL.name.removeprefix("SIG")  # submitit's spelling: "URG"


def sbatch_signal(delay_s: int) -> str:
    """sbatch's --signal: the number (Slurm 22.05 names only HUP ... XCPU), to the job's steps
    only (no "B:": the batch shell, which makes the requeue, is not signalled)."""
    return f"{int(PREEMPT_SIGNAL)}@{delay_s}"


def stand_in_folder(run: RunFolder) -> Path:
    return run.submitit / "bin"


def attempt_folder(run: RunFolder) -> str:
    """The attempt's folder as a shell word, from the job's variables (NodeInfo.attempt)."""
    return shlex.quote(str(run.attempts)) + f'/"${JOB}-${{{RESTART}:-0}}"'


def stand_in(run: RunFolder) -> str:
    """The `scontrol` every task of the job finds first on its PATH (POSIX sh: the image's)."""
    attempt = attempt_folder(run)
    return f"""#!/bin/sh
# deepdive-slurm's scontrol inside the job (slurm/requeue.py). submitit requeues with
# `scontrol requeue JOB` from node 0's task, inside the image where there is no Slurm client:
# this notes the request in the attempt folder, and the batch script on the host requeues the
# job once every node has stopped. Anything else goes to a real scontrol further on the PATH.
if [ "$#" -eq 2 ] && [ "$1" = requeue ] && [ -n "${{{JOB}:-}}" ] && [ "$2" = "${JOB}" ]; then
  attempt={attempt}
  mkdir -p "$attempt" || exit 1
  printf '{{"job_id": "%s", "restart_count": %s, "t": %s}}\\n' "${JOB}" \\
    "${{{RESTART}:-0}}" "$(date +%s)" > "$attempt/.{ASKED}.partial" || exit 1
  mv -f "$attempt/.{ASKED}.partial" "$attempt/{ASKED}" || exit 1
  echo "deepdive: requeue of job ${JOB} asked; the batch script makes it once every node has stopped" >&2
  exit 0
fi
self=$(cd "$(dirname "$0")" && pwd -P)
IFS=:
for dir in $PATH; do
  if [ -n "$dir" ] && [ "$(cd "$dir" 2>/dev/null && pwd -P)" != "$self" ] && [ -x "$dir/scontrol" ]; then
    exec "$dir/scontrol" "$@"
  fi
done
echo "deepdive: scontrol: no Slurm client here (inside the image?); only 'scontrol requeue ${JOB}' is answered, by the batch script" >&2
exit 127
"""


def write_stand_in(run: RunFolder) -> Path:
    """The stand-in, written whole (a task may start while a resubmission rewrites it)."""
    from services.base.files import atomic_write_bytes

    path = stand_in_folder(run) / "scontrol"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, stand_in(run).encode())
    path.chmod(0o755)
    return path


def signal_setup() -> list[str]:
    """The batch script's line that names the warning signal for submitit in the tasks."""
    return [f"export {SIGNAL_ENV}={SIGNAL_NAME}"]


def batch_setup(run: RunFolder) -> list[str]:
    """The batch script's lines before srun (after the user's own setup lines, so the stand-in
    is first on the PATH the tasks inherit; an image gets it with --env, see python_command)."""
    return [
        "# deepdive: the warning signal is SIGURG (ignored by every process that does not ask for",
        "# it, Apptainer's squashfuse too); a requeue waits until every node has stopped",
        "# (slurm/requeue.py)",
        *signal_setup(),
        "deepdive_path=$PATH",
        f"export PATH={shlex.quote(str(stand_in_folder(run)))}:$PATH",
    ]


def batch_teardown(run: RunFolder) -> list[str]:
    """The batch script's lines after srun returned: the requeue node 0 asked for, by the
    host's scontrol, and Slurm's answer beside the request (JSON; its words escaped). The batch
    shell ignores SIGTERM from here on: the requeue ends the job, the answer must be written.
    The script exits with srun's status, as it would without these lines (a failed job stays
    FAILED)."""
    lines = TEARDOWN.replace("ATTEMPT", attempt_folder(run)).replace("$JOB", f"${JOB}")
    return [*lines.replace("ASKED", ASKED).replace("ANSWER", ANSWER).splitlines(), ""]


TEARDOWN = r"""# deepdive: the requeue node 0 asked for, now that every node has stopped (slurm/requeue.py);
# the job's exit status stays srun's
deepdive_status=$?
deepdive_attempt=ATTEMPT
if [[ -e $deepdive_attempt/ASKED ]]; then
  trap '' TERM
  if deepdive_said=$(PATH=$deepdive_path scontrol requeue "$JOB" 2>&1); then
    deepdive_answer='{"requeued": true'
  else
    deepdive_said=${deepdive_said//\\/\\\\}
    deepdive_said=${deepdive_said//\"/\\\"}
    deepdive_said=${deepdive_said//$'\n'/\\n}
    deepdive_said=${deepdive_said//[[:cntrl:]]/ }
    deepdive_answer="{\"requeued\": false, \"error\": \"$deepdive_said\""
    echo "deepdive: Slurm refused to requeue job $JOB: $deepdive_said" >&2
  fi
  echo "$deepdive_answer, \"t\": $(date +%s)}" > "$deepdive_attempt/.ANSWER.partial"
  mv -f "$deepdive_attempt/.ANSWER.partial" "$deepdive_attempt/ANSWER"
fi
exit $deepdive_status"""


def container_environment(run: RunFolder) -> list[str]:
    """apptainer exec's options that give the tasks inside the image the signal's name and the
    stand-in first on their PATH, whatever the image's own PATH (container.options may not drop
    the host's environment: slurm/config.py)."""
    return [
        "--env",
        f"{SIGNAL_ENV}={SIGNAL_NAME}",
        "--env",
        f"PREPEND_PATH={stand_in_folder(run)}",
    ]


def answer_usr2_too() -> None:
    """In the job: USR2, submitit's default (`scancel --signal=USR2 JOB`, as its docs and older
    notes say), does what the warning signal does, through submitit's handler. Inside an image
    mounted by squashfuse a USR2 still ends the mount (docs/cluster.md): send SIGURG (23)."""
    handler = signal.getsignal(PREEMPT_SIGNAL)
    if callable(handler):
        signal.signal(signal.SIGUSR2, handler)
