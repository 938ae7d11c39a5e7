"""Which worker of a failed job is at fault, said in one line.

When one worker of a job dies or stops, the others fail a moment later: their
collectives lose it, and TensorFlow ends them with an `UnavailableError` ("The following
tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1") about
10 s after the last heartbeat of the lost worker. The first worker seen to fail is then
often a healthy one. `blame` looks further: a worker whose process is stopped (a SIGSTOP,
a debugger) or frozen is at fault; else the worker that the failed one's TensorFlow named
unhealthy; else the failed worker itself. Standard library only: the launcher imports no
TensorFlow.

Example:
    >>> fault = blame(failed=0, codes=[1, None], states=[None, "T"],
    ...               reports=[{}, {"epoch": 3, "step": 4}], unhealthy={0: [1]})
    >>> fault.worker, fault.code
    (1, 124)
    >>> print(fault.message)
    worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) after step 4 of epoch 3; \
worker 0 then exited with code 1 (it lost worker 1)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from strategykit.launcher.hang_watch import after_last_step
from strategykit.launcher.process_state import describe, is_stopped
from strategykit.launcher.worker_contract import HUNG


@dataclass(frozen=True)
class Fault:
    """The worker at fault, what the launcher says of it, and the job's exit code."""

    worker: int
    message: str
    code: int


def blame(failed: int, codes: list[int | None], states: list[str | None],
          reports: list[dict], unhealthy: dict[int, list[int]]) -> Fault:
    """The worker at fault when worker `failed` was the first seen to fail.

    Args:
        failed: the worker seen to fail first.
        codes: each worker's exit code then (`Popen.returncode`: negative for a signal),
            None for one still running.
        states: each worker's process state then (`process_state.process_state`).
        reports: each worker's last progress report (`progress_file.read`), `{}` if none.
        unhealthy: for each worker, the workers its TensorFlow named unhealthy.

    Returns:
        A `Fault`. Its code is the failed worker's exit code (128 + N for signal N, as a
        shell reports it), or `worker_contract.HUNG` (124) when a stopped worker is at
        fault.
    """
    for k, state in enumerate(states):
        if k != failed and codes[k] is None and is_stopped(state):
            return Fault(k, f"worker {k} is {describe(state)} {after_last_step(reports[k])}; "
                            f"{_then(failed, codes[failed], k)}", HUNG)
    for k in unhealthy.get(failed, []):
        if k == failed or not 0 <= k < len(codes):
            continue
        if codes[k] is not None:
            return Fault(k, f"worker {k} {ended(codes[k])}; {_then(failed, codes[failed], k)}",
                         shell_code(codes[k]))
        return Fault(k, f"worker {k} stopped sending TensorFlow's heartbeats ("
                        f"{describe(states[k])}) {after_last_step(reports[k])}; "
                        f"{_then(failed, codes[failed], k)}", shell_code(codes[failed]))
    return Fault(failed, f"worker {failed} {ended(codes[failed])}", shell_code(codes[failed]))


def ended(code: int) -> str:
    """How a worker ended, e.g. "exited with code 1" or "was killed by signal SIGKILL (9)"."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {name} ({-code})"


def shell_code(code: int) -> int:
    """A process's exit code as a shell reports it: 128 + N for a signal N."""
    return code if code >= 0 else 128 - code


def _then(failed: int, code: int, lost: int) -> str:
    return f"worker {failed} then {ended(code)} (it lost worker {lost})"
