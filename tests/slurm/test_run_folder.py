"""RUN/command.txt has one writer and one reader (slurm.run_folder.RunFolder): what the node
records is the trainer's argv, and pasted into a shell it runs that argv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slurm.run_folder import RunFolder

# argv elements as exec passes them: any text without NUL
ARGUMENT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))


@given(st.lists(ARGUMENT, min_size=1, max_size=8))
def test_the_recorded_command_reads_back_as_the_argv_it_was(argv: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        run = RunFolder(Path(folder))
        run.record_command(argv)
        assert run.recorded_command() == argv


def test_command_txt_pasted_into_a_shell_runs_the_recorded_argv(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME", "it's"]
    run = RunFolder(tmp_path)
    run.record_command(argv)
    shell = subprocess.run(
        ["bash", "-c", run.command.read_text()], capture_output=True, text=True, check=True
    )
    assert shell.stdout.strip() == str(["a b", "$HOME", "it's"])


def test_no_command_is_recorded_before_the_first_attempt(tmp_path: Path) -> None:
    assert RunFolder(tmp_path).recorded_command() is None
