"""What a node started, in one place: its services, its Ray and (node 0) the trainer.

The phases fill it as they launch each child (slurm/bootstrap.py); the watch reads their
health between polls (slurm/node/watch.py); the teardown stops them all at once, however the
node ends. Each child is stopped by its PID (Ray by its process group), never by name.
"""

from __future__ import annotations

import functools
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.base.process import ServiceProcess, terminate
from slurm.node.ray_cluster import RayNode


@dataclass
class NodeChildren:
    """Filled by the phases as they launch; the watch reads it, the teardown stops it."""

    services: list[ServiceProcess] = field(default_factory=list)
    ray: RayNode | None = None
    trainer: subprocess.Popen[bytes] | None = None

    def stop(self, timeout_s: float) -> dict[str, float]:
        """Every child told to stop at once and awaited together (SIGKILL after `timeout_s`):
        the node's teardown takes its slowest child's time, not their sum, and fits in Slurm's
        KillWait. The seconds each one took, by name."""
        stops: dict[str, Callable[[], None]] = {"trainer": lambda: self._stop_trainer(timeout_s)}
        for service in self.services:
            stops[service.name] = functools.partial(service.stop, timeout_s)
        if self.ray is not None:
            stops["ray"] = functools.partial(self.ray.stop, timeout_s)
        started = time.monotonic()
        seconds: dict[str, float] = {}

        def stop(name: str, action: Callable[[], None]) -> None:
            try:
                action()
            finally:
                seconds[name] = round(time.monotonic() - started, 3)

        threads = [
            threading.Thread(target=stop, args=item, name=f"stop-{item[0]}", daemon=True)
            for item in stops.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return seconds

    def _stop_trainer(self, timeout_s: float) -> None:
        trainer = self.trainer
        if trainer is None or trainer.poll() is not None:
            return
        terminate(trainer, timeout_s)
