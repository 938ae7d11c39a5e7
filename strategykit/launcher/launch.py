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
import time
from collections.abc import Sequence

from strategykit.launcher import hang_watch, held_output, private_network
from strategykit.launcher.fault import blame
from strategykit.launcher.orphan_guard import guarded
from strategykit.launcher.preload import ForkedWorker, Preloader
from strategykit.launcher.private_files import RunFolder
from strategykit.launcher.process_state import process_state
from strategykit.launcher.worker_contract import HUNG, PREEMPTED, PROGRESS_FILE_VARIABLE
from strategykit.launcher.worker_env import count, find_gpus, free_ports, gpu_assignment, worker_env
from strategykit.launcher.worker_output import LineForwarder, Terminal, forward

GRACE_SECONDS = 3.0
"""How long a worker stopped after a peer's failure has, after SIGTERM, before SIGKILL."""

PREEMPTION_GRACE_SECONDS = 60.0
"""How long the workers have to back up and exit after a SIGTERM (to the launcher or to a
worker) before their process groups get SIGKILL."""

_POLL_SECONDS = 0.05
_OUTPUT_SECONDS = 5.0  # how long the last output of a job may take to arrive
_MAX_PORT = 65535
Worker = subprocess.Popen | ForkedWorker
"""A worker process: started as its command, or forked by the preload server."""
NETWORKS = ("private", "host")
"""The networks a job can run in (`launch`'s `network`)."""


def launch(command: Sequence[str], workers: int, restarts: int = 0, port: int | None = None,
           gpus_per_worker: int | None = None,
           hang_timeout: float = hang_watch.DEFAULT_TIMEOUT, network: str = "private",
           verbose: bool = False, preload: bool = False) -> int:
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
    `strategykit.launcher.worker_output`). When a worker exits non-zero or is killed by a signal,
    every other worker's process group gets SIGTERM at once and SIGKILL
    `GRACE_SECONDS` (3 s) later; the launcher says on stderr which worker died and how,
    then starts the whole job again while restarts are left. SIGINT, SIGTERM or SIGHUP
    (a closed terminal, a dropped ssh connection) to the launcher stops the job: every
    worker gets SIGTERM, and with `sk.callbacks.BackupAndRestore` they
    back up the step they agree on and exit 42 (`worker_contract.PREEMPTED`); after
    `PREEMPTION_GRACE_SECONDS` (60 s) what still runs gets SIGKILL. A worker that
    exits 42 by itself (it received SIGTERM) has the others stop after the same step;
    the launcher waits for them and restarts the job from that backup while restarts
    are left. When the job ends, nothing is left running
    in any worker's process group. On Linux a launcher killed by SIGKILL (which it cannot
    catch) takes its workers with it: the kernel sends each SIGKILL
    (`strategykit.launcher.orphan_guard`). A job in which no worker has made training
    progress for `hang_timeout` seconds (one worker stopped or stuck, the others waiting
    for it in an all-reduce) is stopped with SIGKILL, the worker to blame named
    (`strategykit.launcher.hang_watch`), and restarted like a failed one. The worker
    named for a failure is the one at fault (`strategykit.launcher.fault`): a stopped
    peer, or the one TensorFlow names unhealthy, rather than the first to fail.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py"]`.
        workers: how many worker processes, at least 1.
        restarts: how many times a failed job is started again (default 0).
        port: worker k listens on `port + k`; default None: free ports.
        gpus_per_worker: GPUs for each worker; 0 hides every GPU (workers on the CPU);
            default None: the GPUs found divided evenly.
        hang_timeout: seconds without training progress that stop the job; 0 never.
            Default 300. The watch starts with the first step a worker completes.
        network: `"private"` (default): the workers run in a network of the job's own
            (`strategykit.launcher.private_network`), their ports reachable from no other
            machine and no other machine reachable from them; where the kernel does not
            allow it the launcher says so and uses this machine's network. `"host"`: this
            machine's network.
        verbose: show every worker's tracebacks where they come; by default those of
            workers that only echo the failure of the worker at fault go to a log file,
            in the launcher's private folder (`strategykit.launcher.private_files`: the
            only place it writes, removed at its end unless it holds a log).
        preload: import TensorFlow, Keras and strategykit once, in a server process, and
            fork every worker of every attempt from it (`strategykit.launcher.preload`):
            workers and restarts start in milliseconds instead of seconds. Only for
            `python SCRIPT ...` and `python -m MODULE ...` commands; an environment
            variable they read when imported must be set for the launcher, not by the
            script. A server that dies takes the attempt's workers with it (exit 137,
            said as such); the next attempt gets a new one. Default False: each worker
            runs the command as it is.

    Returns:
        The exit code: 0 when every worker exited 0; after the last allowed attempt
        failed, the failed worker's exit code, or 128 + N when it was killed by signal N
        (as a shell reports it), 124 when it hung, 42 when the workers backed up and
        stopped on SIGTERM; 130 on SIGINT, 143 on SIGTERM, 129 on SIGHUP to the
        launcher.

    Raises:
        ValueError: a bad argument (no command or a string for one, `workers` < 1,
            `restarts` < 0, `hang_timeout` < 0, a port out of range, more GPUs asked for
            than found, an unknown network), or a command that cannot start (with
            `preload`: one that is no Python script or module, or whose Python cannot
            import TensorFlow, Keras and strategykit).

    Example:
        >>> launch(["python", "-c", "import os; print(os.environ['STRATEGYKIT_WORKER'])"],
        ...        workers=2)  # doctest: +SKIP
        [worker 0] 0
        [worker 1] 1
        0
    """
    if isinstance(command, str):
        raise ValueError(f"command must be a list: the program, then its arguments. Received: "
                         f"command={command!r}. Use e.g. {command.split()!r}.")
    command = list(command)
    _check_arguments(command, workers, restarts, port, hang_timeout, network)
    gpus = find_gpus()
    devices = gpu_assignment(workers, gpus_per_worker, gpus)
    terminal = Terminal(sys.stdout, sys.stderr)
    if gpus_per_worker is None and 0 < len(gpus) < workers:
        terminal.note(f"{count(len(gpus), 'GPU')} for {workers} workers: every worker sees "
                      "every GPU; --gpus-per-worker 0 runs the workers on the CPU.")
    job_network = _open_network(network, terminal)
    network_pid = job_network.pid if job_network else None
    preloader = None
    run_folder = RunFolder()
    try:
        with _StopSignals() as stop:
            for attempt in range(restarts + 1):
                if attempt:
                    terminal.note(f"restarting the job (restart {attempt} of {restarts}).")
                if preload and (preloader is None or preloader.gone):
                    if preloader is not None:
                        preloader.close()
                    _check_program(command, os.environ.get("PATH"))
                    preloader = Preloader(command, network_pid,
                                          {"PYTHONUNBUFFERED": "1", **os.environ})
                ports = free_ports(workers) if port is None else list(range(port, port + workers))
                code = _run_job(command, attempt, ports, devices, terminal, stop,
                                hang_timeout, job_network, verbose, preloader, run_folder)
                if code == 0 or stop.signal is not None:
                    break
    finally:
        if preloader is not None:
            preloader.close()
        if job_network is not None:
            job_network.close()
        run_folder.close()
    return code


def _open_network(network: str, terminal: Terminal) -> private_network.PrivateNetwork | None:
    """The job's private network; None for the machine's (asked for, or the only one)."""
    if network == "host":
        return None
    try:
        return private_network.start()
    except private_network.Unavailable as error:
        terminal.note(f"no private network for the job here ({error}): its workers' ports "
                      "are open to other machines, as with --network=host (see the README, "
                      "Security).")
        return None


def _check_arguments(command: list[str], workers: int, restarts: int, port: int | None,
                     hang_timeout: float, network: str) -> None:
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
    if network not in NETWORKS:
        raise ValueError(f"unknown network. Received: network={network!r}. Use "
                         "--network=private (the default: the job's own, reachable from no "
                         "other machine) or --network=host (this machine's network).")
    last = _MAX_PORT - workers + 1
    if port is not None and not 1 <= port <= last:
        raise ValueError(
            f"worker k listens on port + k, and ports go from 1 to {_MAX_PORT}. Received: "
            f"port={port}, workers={workers}. Use --port from 1 to {last}, or leave --port "
            "out to use free ports.")


def _run_job(command: list[str], attempt: int, ports: list[int], devices: list[str | None],
             terminal: Terminal, stop: _StopSignals, hang_timeout: float,
             job_network: private_network.PrivateNetwork | None, verbose: bool,
             preloader: Preloader | None, run_folder: RunFolder) -> int:
    """Runs one attempt of the job; returns its exit code (see `launch`)."""
    where = ("in a private network (reachable from this job only)" if job_network
             else "on this machine's network")
    terminal.note(f"starting {count(len(ports), 'worker')} on localhost, "
                  f"port{'s' * (len(ports) > 1)} {', '.join(map(str, ports))}, {where}.")
    network_pid = job_network.pid if job_network else None
    processes: list[Worker] = []
    readers = []
    stderrs: list[LineForwarder] = []
    failed = hung = None
    states: list[str | None] = []
    reports = run_folder.attempt_folder(attempt)
    paths = [os.path.join(reports, f"worker-{k}.json") for k in range(len(devices))]
    watch = hang_watch.HangWatch(paths, hang_timeout)
    try:
        for k, device in enumerate(devices):
            env = {**worker_env(k, attempt, ports, device), PROGRESS_FILE_VARIABLE: paths[k]}
            process = preloader.start(env) if preloader else _start(command, env, network_pid)
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
            progress = watch.reports()
            hung = watch.check(time.time(), states, progress)
            if hung is not None:  # a stopped process ignores SIGTERM: no grace
                signal_groups(processes, signal.SIGKILL)
                break
            held_output.show_if_going_on(stderrs, codes, progress)
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
        held_output.set_aside_echoes(stderrs, None, run_folder.log_path(attempt), terminal)
        return HUNG
    if stop.signal is not None:
        held_output.show(stderrs)
        terminal.note(f"received {signal.Signals(stop.signal).name}; stopped "
                      f"{count(len(stopped), 'worker')}.")
        return 128 + stop.signal
    if failed is None:
        held_output.show(stderrs)
        return 0
    code = processes[failed].returncode
    if code == PREEMPTED:
        held_output.show(stderrs)
        terminal.note(f"after a SIGTERM every worker backed up the same step and stopped "
                      f"(exit {PREEMPTED}){others}.")
        return code
    if preloader is not None and preloader.gone:
        terminal.note(f"the preload server (pid {preloader.pid}) ended during the job, and "
                      f"its workers with it{others}.")
        held_output.show(stderrs)
        return 128 + signal.SIGKILL
    unhealthy = {k: forwarder.unhealthy_workers for k, forwarder in enumerate(stderrs)}
    fault = blame(failed, codes, states, last_reports, unhealthy)
    terminal.note(f"{fault.message}{others}.")
    held_output.set_aside_echoes(stderrs, fault.worker, run_folder.log_path(attempt), terminal)
    if job_network and any(forwarder.saw_unreachable for forwarder in stderrs):
        terminal.note("the job runs in a private network, where its workers cannot reach "
                      "other machines (a download, an experiment tracker): run it with "
                      "--network=host if it needs to (see the README, Security).")
    return fault.code


def _states(processes: list[Worker], codes: list[int | None]) -> list[str | None]:
    """Each worker's process state (`process_state`); `hang_watch.EXITED` once it ended."""
    return [hang_watch.EXITED if code is not None else process_state(process.pid)
            for process, code in zip(processes, codes)]


def _first_failed(codes: list[int | None]) -> int | None:
    """The worker that failed, of those seen failed in one poll; None when none did.

    A peer's death makes the other workers fail too (their collectives break), often
    within one poll: a worker killed by a signal is the likelier cause, so it is named
    first, then the lowest index.
    """
    failed = [k for k, code in enumerate(codes) if code not in (None, 0)]
    return min(failed, key=lambda k: (codes[k] > 0, k)) if failed else None


def _check_program(command: list[str], path: str | None) -> None:
    """Raises the ValueError of a program that cannot start: through the orphan guard, a
    missing one would show only as exit 127."""
    program = command[0]
    if shutil.which(program, path=path) is None:
        reason = errno.EACCES if os.path.isfile(program) else errno.ENOENT
        raise _cannot_start(command, os.strerror(reason))


def _start(command: list[str], env: dict[str, str], network_pid: int | None) -> subprocess.Popen:
    """Starts one worker in a process group of its own, guarded to die with the launcher."""
    _check_program(command, env.get("PATH"))
    try:
        return subprocess.Popen(guarded(command, os.getpid(), network_pid), env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:
        raise _cannot_start(command, error.strerror) from error


def _cannot_start(command: list[str], reason: str) -> ValueError:
    return ValueError(f"cannot start {command[0]!r}: {reason}. Received: "
                     f"command={command}. Check the command after --.")


def _stop(processes: list[Worker], grace: float) -> list[int]:
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


def signal_groups(processes: list[Worker], signum: int) -> None:
    """Sends `signum` to the process group of each process (started in its own session).

    A group that is gone is skipped; a reaped leader's group gets it for what it left.
    """
    for process in processes:
        process.poll()  # a reaped leader: only what it left in its group is signalled
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(process: Worker) -> bool:
    """Whether anything still runs in the worker's process group (its leader reaped)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, but not ours to signal
        pass
    return True


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
"""The signals to the launcher that stop the job: each worker gets SIGTERM. SIGHUP is
what a closed terminal or a dropped ssh connection sends; the workers, each in a session
of its own, get nothing from the terminal themselves."""


class _StopSignals:
    """While open, `STOP_SIGNALS` are recorded in `signal` instead of ending Python."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self) -> _StopSignals:
        for signum in STOP_SIGNALS:
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
