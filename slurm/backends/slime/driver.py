"""What node 0 runs for `backend = "slime"`: slime's own train.py, through this driver, so that
Slurm's warning saves at the next rollout boundary (slurm/node/preemption.py).

`python -m slurm.backends.slime.driver ARGV` in slime's root (the trainer's working
directory, so `import train` finds train.py first on sys.path, as `python train.py` would)
does what train.py's `__main__` does (train.py:97-99 at 624b824: `parse_args()`, then
`train(args)`), with two additions that change nothing else:

- the warning signal (SIGURG) sets `args.save_interval = 1`: train.py asks
  `should_run_periodic_action(rollout_id, args.save_interval, ...)` after every rollout's
  training step (train.py:71-72), which is true for any step with interval 1
  (slime/utils/misc.py:107-128), so the next rollout boundary saves;
- each save's time is recorded (deepdive/save_timing.py): from the actor group's
  `save_model` (train.py:76) to its next `update_weights` (train.py:85), so the data source's
  state (train.py:79-80) is saved too before node 0 reads the save as done. The actor group is
  the one train.py makes with `create_training_models` (imported into train.py's namespace,
  train.py:4, called at train.py:21): the driver hands train.py a version that times it.

The argv is slime's alone: whatever the driver needs comes from its environment.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from deepdive.save_timing import WARNING_SIGNAL, SaveTimer


class SaveClock:
    """Times the actor group's saves: from `save_model` to the next `update_weights`."""

    def __init__(self, timer: SaveTimer, clock: Callable[[], float] = time.monotonic) -> None:
        self.timer = timer
        self.clock = clock
        self._started: float | None = None
        self._rollout = 0

    def time_saves(self, actor: Any) -> None:
        save, update = actor.save_model, actor.update_weights

        def timed_save(rollout_id: int, *args: Any, **kwargs: Any) -> Any:
            if self._started is None:
                self._started, self._rollout = self.clock(), rollout_id
            return save(rollout_id, *args, **kwargs)

        def update_after_save(*args: Any, **kwargs: Any) -> Any:
            self.finished()
            return update(*args, **kwargs)

        actor.save_model = timed_save
        actor.update_weights = update_after_save

    def finished(self) -> None:
        if self._started is not None:
            self.timer.saved(self._rollout, self.clock() - self._started)  # Megatron's iteration
            self._started = None

    def timed(self, create: Callable[..., Any]) -> Callable[..., Any]:
        """train.py's create_training_models, its actor group's saves timed."""

        def create_timed(*args: Any, **kwargs: Any) -> Any:
            actor, critic = create(*args, **kwargs)
            self.time_saves(actor)
            return actor, critic

        return create_timed


def save_on_warning(args: Any) -> None:
    """The warning signal makes the next rollout boundary save (train.py:71-72)."""

    def on_warning(number: int, frame: FrameType | None) -> None:
        args.save_interval = 1
        print("deepdive: warned (preemption or time limit): saving at the next rollout", flush=True)

    signal.signal(WARNING_SIGNAL, on_warning)


def drive(train: Any, args: Any, timer: SaveTimer) -> None:
    """train.py's train(args), with the warning's save and the saves timed."""
    clock = SaveClock(timer)
    train.create_training_models = clock.timed(train.create_training_models)
    save_on_warning(args)
    train.train(args)
    clock.finished()  # the last rollout's save has no update_weights after it


def main() -> None:
    import train  # type: ignore[import-not-found]  # slime's train.py, in the working directory
    from slime.utils.arguments import parse_args

    drive(train, parse_args(), SaveTimer.from_environment())


if __name__ == "__main__":  # python -m puts the working directory (slime's root) first
    main()
