"""`strategykit launch`: N worker processes of one command on this machine, one job.

Like `torchrun --standalone` or `horovodrun -np N`: every worker gets its `TF_CONFIG`,
so `sk.from_env()` in the command builds one `MultiWorkerMirroredStrategy` over all of
them; a worker that dies stops the job at once, or restarts it when asked. This module
imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from strategykit.cluster import hang_watch, progress_file
from strategykit.cluster.exit_codes import PREEMPTED
from strategykit.cluster.fault import blame
from strategykit.cluster.orphan_guard import guarded
from strategykit.cluster.process_state import process_state
from strategykit.cluster.worker_env import count, find_gpus, free_ports, gpu_assignment, worker_env
from strategykit.cluster.worker_output import LineForwarder, Terminal, forward

GRACE_SECONDS = 3.0
"""How long a worker stopped after a peer's failure has, after SIGTERM, before SIGKILL."""

PREEMPTION_GRACE_SECONDS = 60.0
"""How long the workers have to back up and exit after a SIGTERM (to the launcher or to a
worker) before their process groups get SIGKILL."""

_POLL_SECONDS = 0.05
_OUTPUT_SECONDS = 5.0  # how long the last output of a job may take to arrive
_HELD_SECONDS = 5.0  # a traceback of a worker that goes on is shown this much later
_MAX_PORT = 65535


def launch(command: Sequence[str], workers: int, restarts: int = 0, port: int | None = None,
           gpus_per_worker: int | None = None,
           hang_timeout: float = hang_watch.DEFAULT_TIMEOUT, verbose: bool = False) -> int:
    """Runs `command` as `workers` worker processes of one job on this machine.

    Worker k (worker 0 is the chief) runs in its own process group with the launcher's
    environment plus:

    - `TF_CONFIG`: `{"cluster": {"worker": ["localhost:p0", ...]}, "task": {"type":
      "worker", "index": k}}`, the ports free loopback ports picked anew for every
      attempt, or `port + k` when `port` is given;
    - `STRATEGYKIT_WORKER`: k;
    - `STRATEGYKIT_RESTART`: the attempt, 0 at first, 1 after the first restart, ...;
    - `CUDA_VISIBLE_DEVICES`: GPUs `k*G .. k*G+G-1` of those found (listed in the
      launcher's own `CUDA_VISIBLE_DEVICES` when set, else by `nvidia-smi -L`), with
      `G = gpus_per_worker`, by default the GPUs found divided by `workers`; left as it
      is when no GPU is found (on CPUs each worker is one replica), or when there are
      fewer GPUs than workers (every worker sees them all);
    - `PYTHONUNBUFFERED=1` unless set, so a worker's prints show when they happen;
    - `STRATEGYKIT_PROGRESS_FILE`: where `sk.from_env()` has the worker report its
      training progress (`strategykit.cluster.progress_reporter`).

    Each worker's stdout and stderr lines come out on the launcher's stdout and stderr
    prefixed `[worker k] `; of the progress bars only the chief's is shown (see
    `strategykit.cluster.worker_output`). When a worker exits non-zero or is killed by a signal,
    every other worker's process group gets SIGTERM at once and SIGKILL
    `GRACE_SECONDS` (3 s) later; the launcher says on stderr which worker died and how,
    then starts the whole job again while restarts are left. SIGINT or SIGTERM to the
    launcher is passed on to every worker: with `sk.callbacks.BackupAndRestore`, they
    back up the step they agree on and exit 42 (`exit_codes.PREEMPTED`); after
    `PREEMPTION_GRACE_SECONDS` (60 s) what still runs gets SIGKILL. A worker that
    exits 42 by itself (it received SIGTERM) has the others stop after the same step;
    the launcher waits for them and restarts the job from that backup while restarts
    are left. When the job ends, nothing is left running
    in any worker's process group. On Linux a launcher killed by SIGKILL (which it cannot
    catch) takes its workers with it: the kernel sends each SIGKILL
    (`strategykit.cluster.orphan_guard`). A job in which no worker has made training
    progress for `hang_timeout` seconds (one worker stopped or stuck, the others waiting
    for it in an all-reduce) is stopped with SIGKILL, the worker to blame named
    (`strategykit.cluster.hang_watch`), and restarted like a failed one.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py"]`.
        workers: how many worker processes, at least 1.
        restarts: how many times a failed job is started again (default 0).
        port: worker k listens on `port + k`; default None: free ports.
        gpus_per_worker: GPUs for each worker; 0 hides every GPU (workers on the CPU);
            default None: the GPUs found divided evenly.
        hang_timeout: seconds without training progress that stop the job; 0 never.
            Default 300. The watch starts with the first step a worker completes.

    Returns:
        The exit code: 0 when every worker exited 0; after the last allowed attempt
        failed, the failed worker's exit code, or 128 + N when it was killed by signal N
        (as a shell reports it), 124 when it hung, 42 when the workers backed up and
        stopped on SIGTERM; 130 on SIGINT, 143 on SIGTERM to the launcher.

    Raises:
        ValueError: a bad argument (no command or a string for one, `workers` < 1,
            `restarts` < 0, `hang_timeout` < 0, a port out of range, more GPUs asked for
            than found), or a command that cannot start.

    Example:
        >>> launch(["python", "-c", "import os; print(os.environ['STRATEGYKIT_WORKER'])"],
        ...        workers=2)  # doctest: +SKIP
        strategykit launch: starting 2 workers on localhost, ports 40123, 40124.
        [worker 0] 0
        [worker 1] 1
        0
    """
    if isinstance(command, str):
        raise ValueError(f"command must be a list: the program, then its arguments. Received: "
                         f"command={command!r}. Use e.g. {command.split()!r}.")
    command = list(command)
    _check_arguments(command, workers, restarts, port, hang_timeout)
    gpus = find_gpus()
    devices = gpu_assignment(workers, gpus_per_worker, gpus)
    terminal = Terminal(sys.stdout, sys.stderr)
    if gpus_per_worker is None and 0 < len(gpus) < workers:
        terminal.note(f"{count(len(gpus), 'GPU')} for {workers} workers: every worker sees "
                      "every GPU; --gpus-per-worker 0 runs the workers on the CPU.")
    with _StopSignals() as stop:
        for attempt in range(restarts + 1):
            if attempt:
                terminal.note(f"restarting the job (restart {attempt} of {restarts}).")
            ports = free_ports(workers) if port is None else list(range(port, port + workers))
            code = _run_job(command, attempt, ports, devices, terminal, stop, hang_timeout,
                            verbose)
            if code == 0 or stop.signal is not None:
                break
    return code


def _check_arguments(command: list[str], workers: int, restarts: int, port: int | None,
                     hang_timeout: float) -> None:
    if not command:
        raise ValueError("no command to run. Received: command=[]. Put the command after "
                         "--: strategykit launch --workers 2 -- python train.py")
    if workers < 1:
        raise ValueError(f"the job needs at least 1 worker. Received: workers={workers}. "
                         "Use --workers 1 or more.")
    if restarts < 0:
        raise ValueError(f"restarts cannot be negative. Received: restarts={restarts}. Use "
                         "--restarts 0 (the default) for no restart, or K to allow K.")
    if hang_timeout < 0:
        raise ValueError(f"hang_timeout cannot be negative. Received: hang_timeout="
                         f"{hang_timeout:g}. Use --hang-timeout S for S seconds, or 0 to "
                         "never stop a job that makes no progress.")
    last = _MAX_PORT - workers + 1
    if port is not None and not 1 <= port <= last:
        raise ValueError(
            f"worker k listens on port + k, and ports go from 1 to {_MAX_PORT}. Received: "
            f"port={port}, workers={workers}. Use --port from 1 to {last}, or leave --port "
            "out to use free ports.")


def _run_job(command: list[str], attempt: int, ports: list[int], devices: list[str | None],
             terminal: Terminal, stop: _StopSignals, hang_timeout: float,
             verbose: bool) -> int:
    """Runs one attempt of the job; returns its exit code (see `launch`)."""
    terminal.note(f"starting {count(len(ports), 'worker')} on localhost, "
                  f"port{'s' * (len(ports) > 1)} {', '.join(map(str, ports))}.")
    processes: list[subprocess.Popen] = []
    readers = []
    stderrs: list[LineForwarder] = []
    failed = hung = None
    states: list[str | None] = []
    reports = tempfile.mkdtemp(prefix="strategykit-progress-")
    paths = [os.path.join(reports, f"worker-{k}.json") for k in range(len(devices))]
    watch = hang_watch.HangWatch(paths, hang_timeout)
    try:
        for k, device in enumerate(devices):
            env = {**worker_env(k, attempt, ports, device), progress_file.VARIABLE: paths[k]}
            process = _start(command, env)
            processes.append(process)
            for stream in ("stdout", "stderr"):
                pipe = getattr(process, stream)
                forwarder = LineForwarder(terminal, k, stream, hold_tracebacks=not verbose)
                readers.append(forward(os.dup(pipe.fileno()), forwarder))
                pipe.close()
            stderrs.append(forwarder)
        preempted_by = None  # the deadline of the workers' backup after a SIGTERM
        while stop.signal is None:
            codes = [process.poll() for process in processes]
            states = _states(processes, codes)
            failed = _first_failed(codes)
            if PREEMPTED in codes and preempted_by is None:
                preempted_by = time.monotonic() + PREEMPTION_GRACE_SECONDS
            if preempted_by is not None:  # the others stop after the same step
                if None not in codes or time.monotonic() > preempted_by:
                    break
            elif failed is not None or all(code == 0 for code in codes):
                break
            hung = watch.check(time.time(), states)
            if hung is not None:  # a stopped process ignores SIGTERM: no grace
                signal_groups(processes, signal.SIGKILL)
                break
            _show_tracebacks_of_running_workers(stderrs, codes)
            time.sleep(_POLL_SECONDS)
    finally:
        stopped = _stop(processes, PREEMPTION_GRACE_SECONDS if stop.signal else GRACE_SECONDS)
        last_reports = watch.reports()
        shutil.rmtree(reports, ignore_errors=True)
        deadline = time.monotonic() + _OUTPUT_SECONDS
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
    others = f"; stopped the other {count(len(stopped), 'worker')}" if stopped else ""
    if hung is not None:
        terminal.note(f"{hung}; stopped the job.")
        _set_aside_tracebacks(stderrs, None, attempt, terminal)
        return hang_watch.EXIT_CODE
    if stop.signal is not None:
        _show_tracebacks(stderrs)
        terminal.note(f"received {signal.Signals(stop.signal).name}; stopped "
                      f"{count(len(stopped), 'worker')}.")
        return 128 + stop.signal
    if failed is None:
        _show_tracebacks(stderrs)
        return 0
    code = processes[failed].returncode
    if code == PREEMPTED:
        _show_tracebacks(stderrs)
        terminal.note(f"after a SIGTERM every worker backed up the same step and stopped "
                      f"(exit {PREEMPTED}){others}.")
        return code
    unhealthy = {k: forwarder.unhealthy_workers for k, forwarder in enumerate(stderrs)}
    fault = blame(failed, codes, states, last_reports, unhealthy)
    terminal.note(f"{fault.message}{others}.")
    _set_aside_tracebacks(stderrs, fault.worker, attempt, terminal)
    return fault.code


def _states(processes: list[subprocess.Popen], codes: list[int | None]) -> list[str | None]:
    """Each worker's process state (`process_state`); `hang_watch.EXITED` once it ended."""
    return [hang_watch.EXITED if code is not None else process_state(process.pid)
            for process, code in zip(processes, codes)]


def _show_tracebacks_of_running_workers(stderrs: list[LineForwarder],
                                        codes: list[int | None]) -> None:
    """A worker still running `_HELD_SECONDS` after a traceback printed it and went on."""
    now = time.monotonic()
    for forwarder, code in zip(stderrs, codes):
        if code is None and forwarder.held_since is not None \
                and now - forwarder.held_since > _HELD_SECONDS:
            forwarder.release()


def _show_tracebacks(stderrs: list[LineForwarder]) -> None:
    for forwarder in stderrs:
        forwarder.release()


def _set_aside_tracebacks(stderrs: list[LineForwarder], at_fault: int | None, attempt: int,
                          terminal: Terminal) -> None:
    """Shows the traceback of the worker at fault; those of the others, which only echo
    it (their collectives lost that worker), go to a log file that the launcher names."""
    if at_fault is not None:
        stderrs[at_fault].release()
    log_path = os.path.join(tempfile.gettempdir(),
                            f"strategykit-launch-{os.getpid()}-attempt-{attempt}.log")
    echoed = []
    with open(log_path, "w") as log:
        for k, forwarder in enumerate(stderrs):
            log.write(f"--- worker {k} ---\n")
            if k != at_fault and forwarder.divert(log):
                echoed.append(k)
    if not echoed:
        os.remove(log_path)
        return
    workers = " and ".join(f"worker {k}" for k in echoed)
    terminal.note(f"the error output of {workers}, which follows from that, is in "
                  f"{log_path}; --verbose shows it here.")


def _first_failed(codes: list[int | None]) -> int | None:
    """The worker that failed, of those seen failed in one poll; None when none did.

    A peer's death makes the other workers fail too (their collectives break), often
    within one poll: a worker killed by a signal is the likelier cause, so it is named
    first, then the lowest index.
    """
    failed = [k for k, code in enumerate(codes) if code not in (None, 0)]
    return min(failed, key=lambda k: (codes[k] > 0, k)) if failed else None


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Starts one worker in a process group of its own, guarded to die with the launcher."""
    program = command[0]
    if shutil.which(program, path=env.get("PATH")) is None:
        # Checked here: through the guard, a missing program would show only as exit 127.
        reason = errno.EACCES if os.path.isfile(program) else errno.ENOENT
        raise _cannot_start(command, os.strerror(reason))
    try:
        return subprocess.Popen(guarded(command, os.getpid()), env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:
        raise _cannot_start(command, error.strerror) from error


def _cannot_start(command: list[str], reason: str) -> ValueError:
    return ValueError(f"cannot start {command[0]!r}: {reason}. Received: "
                     f"command={command}. Check the command after --.")


def _stop(processes: list[subprocess.Popen], grace: float) -> list[int]:
    """Stops every worker's process group: SIGTERM, then SIGKILL after `grace` seconds.

    Returns:
        The indices of the workers that were still running.
    """
    running = [k for k, process in enumerate(processes) if process.poll() is None]
    signal_groups(processes, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(map(_group_alive, processes)):
        time.sleep(_POLL_SECONDS)
    signal_groups(processes, signal.SIGKILL)
    for process in processes:
        process.wait()
    return running


def signal_groups(processes: list[subprocess.Popen], signum: int) -> None:
    """Sends `signum` to the process group of each process (started in its own session).

    A group that is gone is skipped; a reaped leader's group gets it for what it left.
    """
    for process in processes:
        process.poll()  # a reaped leader: only what it left in its group is signalled
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(process: subprocess.Popen) -> bool:
    """Whether anything still runs in the worker's process group (its leader reaped)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, but not ours to signal
        pass
    return True


class _StopSignals:
    """While open, SIGINT and SIGTERM are recorded in `signal` instead of ending Python."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self) -> _StopSignals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._record)
            except ValueError:  # not the main thread: signals stay as they were
                pass
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _record(self, signum: int, frame) -> None:
        self.signal = signum
