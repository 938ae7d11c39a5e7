"""The launcher's hang watch: a job that makes no training progress is stopped, not waited on.

In a job of several workers one hung worker (a stopped process, a stuck input pipeline,
a network partition) makes every other wait in its all-reduce forever. Each worker
started by `strategykit launch` reports its progress (`progress_file`), written by a
heartbeat thread; the launcher checks the reports while the job runs. When no worker
has made progress for `timeout` seconds, `HangWatch.check` names the worker to blame:
the one whose heartbeat stopped (its process is stopped or frozen), else the one
furthest behind; when all are at the same step none is singled out. The watch starts
with the first progress a worker reports, so starting up (importing TensorFlow, tracing
the first step) never counts as a hang, and a script that never calls `fit()` is not
watched. Standard library only: the launcher imports no TensorFlow.
"""

from __future__ import annotations

from strategykit.cluster.progress_file import HEARTBEAT_SECONDS, read

DEFAULT_TIMEOUT = 300.0
"""Seconds without progress after which `strategykit launch` stops a job by default."""
EXIT_CODE = 124
"""The launcher's exit code for a job stopped as hung (as `timeout` reports one)."""
_SILENT_SECONDS = 3 * HEARTBEAT_SECONDS  # a heartbeat this old: the process does not run


class HangWatch:
    """Decides from the workers' progress files whether a job hangs.

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

    def check(self, now: float) -> str | None:
        """None while the job makes progress; else what hangs, as the launcher says it.

        Args:
            now: the time, as `time.time()` gives it.

        Returns:
            None, or a message such as "worker 1 made no progress for 60 s; last step 2
            of epoch 1 (its process does not run: stopped or frozen)".
        """
        if not self.timeout:
            return None
        reports = [read(path) or {} for path in self.paths]
        progress = [report["progress"] for report in reports if report.get("progress")]
        if not progress or now - max(progress) < self.timeout:
            return None
        silent = [k for k, report in enumerate(reports)
                  if now - report.get("heartbeat", 0) > _SILENT_SECONDS]
        if silent:
            k = silent[0]
            return (f"worker {k} made no progress for {self.timeout:g} s; "
                    f"{_last_step(reports[k])} (its process does not run: stopped or frozen)")
        positions = [(report.get("epoch") or 0, report.get("step") or 0) for report in reports]
        behind = [k for k, position in enumerate(positions) if position == min(positions)]
        if len(behind) == 1:
            k = behind[0]
            return f"worker {k} made no progress for {self.timeout:g} s; {_last_step(reports[k])}"
        return (f"no worker made progress for {self.timeout:g} s; "
                f"{_last_step(reports[behind[0]])} on every worker")


def _last_step(report: dict) -> str:
    if not report.get("step"):
        return "no training step completed"
    return f"last step {report['step']} of epoch {report['epoch']}"
