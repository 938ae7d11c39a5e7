"""The launcher's hang watch: a job that makes no training progress is stopped, not waited on.

In a job of several workers one hung worker (a stopped process, a stuck input pipeline,
a network partition) makes every other wait in its all-reduce forever. Each worker
started by `strategykit launch` reports its progress (`progress_file`), written by a
heartbeat thread; the launcher checks the reports while the job runs, with each worker
process's state (`process_state`). When a worker is inside `fit()`, `evaluate()` or
`predict()` and no worker has made progress for `timeout` seconds, `HangWatch.check`
names the worker to blame: the one whose process is stopped, else the one whose
heartbeat stopped (its process is frozen), else the one furthest behind; when all are at
the same step none is singled out. The watch starts with the first progress a worker
reports, so starting up (importing TensorFlow, tracing the first step) never counts as a
hang; a script that never calls `fit()` is not watched, nor the time before, between and
after its calls (saving a model, exiting: a worker's heartbeat stops while Python shuts
down), nor a worker that has exited. A job stopped as hung ends with
`worker_contract.HUNG` (124). Standard library only: the launcher imports no TensorFlow.
"""

from __future__ import annotations

from strategykit.launcher.process_state import describe, is_stopped
from strategykit.launcher.progress_file import HEARTBEAT_SECONDS, read

DEFAULT_TIMEOUT = 300.0
"""Seconds without progress after which `strategykit launch` stops a job by default."""
_SILENT_SECONDS = 3 * HEARTBEAT_SECONDS  # a heartbeat this old: the process does not run
EXITED = "exited"
"""The state `HangWatch.check` takes for a worker whose process has ended."""


class HangWatch:
    """Decides from the workers' progress files and processes whether a job hangs.

    Args:
        paths: each worker's progress file, worker 0 first.
        timeout: seconds without progress that make a hang; 0 turns the watch off.

    Example:
        >>> watch = HangWatch(["/nonexistent/worker-0.json"], timeout=60)
        >>> watch.check(now=1e9) is None  # no worker has made progress yet
        True
    """

    def __init__(self, paths: list[str], timeout: float):
        self.paths = list(paths)
        self.timeout = timeout

    def reports(self) -> list[dict]:
        """Each worker's last written progress report; `{}` for one not written yet."""
        return [read(path) or {} for path in self.paths]

    def check(self, now: float, states: list[str | None] | None = None,
              reports: list[dict] | None = None) -> str | None:
        """None while the job makes progress; else what hangs, as the launcher says it.

        Args:
            now: the time, as `time.time()` gives it.
            states: each worker's process state (`process_state.process_state`), `EXITED`
                for one that has ended, None where unknown; default: all unknown.
            reports: the workers' reports (`reports()`) when just read; default: read now.

        Returns:
            None, or a message such as "worker 1 is stopped (process state T: a SIGSTOP
            or Ctrl-Z) after step 2 of epoch 1; no worker made progress for 60 s".
        """
        if not self.timeout:
            return None
        reports = self.reports() if reports is None else reports
        states = list(states) if states is not None else [None] * len(reports)
        running = [k for k, state in enumerate(states) if state != EXITED]
        progress = [report["progress"] for report in reports if report.get("progress")]
        in_call = any(reports[k].get("calls", 1) for k in running if reports[k])
        if not progress or not in_call or now - max(progress) < self.timeout:
            return None
        waited = f"no worker made progress for {self.timeout:g} s"
        stopped = [k for k in running if is_stopped(states[k])]
        if stopped:
            k = stopped[0]
            return f"worker {k} is {describe(states[k])} {after_last_step(reports[k])}; {waited}"
        silent = [k for k in running if now - reports[k].get("heartbeat", 0) > _SILENT_SECONDS]
        if silent:
            k = silent[0]
            if states[k] == "D":
                return f"worker {k} is {describe('D')} {after_last_step(reports[k])}; {waited}"
            return (f"worker {k} stopped its heartbeat {after_last_step(reports[k])} (its "
                    f"process is frozen); {waited}")
        positions = {k: (reports[k].get("epoch") or 0, reports[k].get("step") or 0)
                     for k in running}
        behind = [k for k in running if positions[k] == min(positions.values())]
        if len(behind) == 1:
            k = behind[0]
            return f"worker {k} is furthest behind, {after_last_step(reports[k])}; {waited}"
        return f"{waited}; every worker is {after_last_step(reports[behind[0]])}"


def last_step(report: dict) -> str:
    """A worker's last completed training step in words, e.g. "step 3 of epoch 2"."""
    if not report.get("step"):
        return "no training step completed"
    return f"step {report['step']} of epoch {report['epoch']}"


def after_last_step(report: dict) -> str:
    """When a worker stopped, in words: "after step 3 of epoch 2", or before any step."""
    if not report.get("step"):
        return "before its first training step"
    return f"after {last_step(report)}"
