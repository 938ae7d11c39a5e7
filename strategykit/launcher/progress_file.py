"""A worker's progress as `strategykit launch` watches it: one small JSON file a worker.

The launcher names each worker's file in the environment variable
`STRATEGYKIT_PROGRESS_FILE` (`worker_contract.PROGRESS_FILE_VARIABLE`). The file
holds the worker's last completed training step (`epoch` and `step`, both counted from
1 as Keras's progress bar shows them), when it made progress last (`progress`: a step
or an evaluation batch) and when it last showed it is alive (`heartbeat`, written every
`HEARTBEAT_SECONDS` by a thread of its own), and how many `fit()`, `evaluate()` or
`predict()` calls it is in (`calls`; 0 before, between and after them, when the worker
makes no training progress by design: it saves a model, writes a report, exits). A
stopped or frozen process stops both times; a worker that waits (a stuck input
pipeline, a peer that hangs) only the first. Steps
only update memory; the heartbeat thread writes, whole (a temporary file, renamed), so
the launcher reads a complete file at any time and training pays no file write a step.
This module uses the standard library only: the launcher imports it too.
"""

from __future__ import annotations

import json
import os
import threading
import time

HEARTBEAT_SECONDS = 1.0
"""How often a worker writes its file."""


class ProgressFile:
    """The worker's side: records progress in memory, writes it with every heartbeat.

    Args:
        path: the file to write (the launcher's `STRATEGYKIT_PROGRESS_FILE`).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "worker-0.json")
        >>> progress = ProgressFile(path)
        >>> progress.record(epoch=1, step=3)
        >>> progress.write()
        >>> read(path)["step"]
        3
    """

    def __init__(self, path: str):
        self.path = path
        self._state = {"epoch": None, "step": None, "progress": None, "calls": 0}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def record(self, epoch: int | None = None, step: int | None = None) -> None:
        """Notes progress now; `epoch` and `step` (from 1) when a training step ended."""
        state = {"progress": time.time()}
        if step is not None:
            state.update(epoch=epoch, step=step)
        with self._lock:
            self._state.update(state)

    def enter_call(self) -> None:
        """Notes that a `fit()`, `evaluate()` or `predict()` call begins (they may nest)."""
        with self._lock:
            self._state["calls"] += 1
            self._state["progress"] = time.time()

    def leave_call(self) -> None:
        """Notes that the call begun last ended."""
        with self._lock:
            self._state["calls"] = max(0, self._state["calls"] - 1)
            self._state["progress"] = time.time()

    def write(self) -> None:
        """Writes the file now, whole, with a fresh heartbeat."""
        with self._lock:
            data = {**self._state, "heartbeat": time.time()}
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            json.dump(data, file)
        os.replace(temporary, self.path)

    def start_heartbeat(self) -> None:
        """Writes the file every `HEARTBEAT_SECONDS` from a daemon thread (idempotent)."""
        if self._thread is not None:
            return

        def beat() -> None:
            while True:
                try:
                    self.write()
                except OSError:  # the launcher's folder is gone: it has stopped the job
                    return
                time.sleep(HEARTBEAT_SECONDS)

        self._thread = threading.Thread(target=beat, daemon=True,
                                        name="strategykit-heartbeat")
        self._thread.start()


def read(path: str) -> dict | None:
    """The launcher's side: a worker's last written progress; None before its first."""
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None
