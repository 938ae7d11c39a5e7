"""Tests of `strategykit launch` with tiny Python workers (no TensorFlow in the workers).

The launcher runs as the user runs it, `python -m strategykit_console launch ...`, in its
own process group; a launcher that outlives its test's timeout is killed with its group
and the test fails. Every worker records its pid (and what it saw) in a file, and
whatever of them is still alive at the end of a test is killed: a test may fail, it
never hangs and leaves nothing behind.
"""

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from strategykit.cli import commands as cli
from strategykit.launcher import launch as launch_module
from strategykit.launcher.launch import launch
from strategykit.launcher.worker_env import find_gpus, gpu_assignment, worker_env
from strategykit.launcher.worker_output import LineForwarder, Terminal

TIMEOUT = 60
"""Seconds a launcher may run in a test before it is killed and the test fails."""

WORKER_PRELUDE = """\
import json, os, signal, subprocess, sys, time
k = int(os.environ["STRATEGYKIT_WORKER"])
attempt = int(os.environ["STRATEGYKIT_RESTART"])
FOLDER = {folder!r}

def write_whole(path, facts):
    with open(path + ".tmp", "w") as file:
        json.dump(facts, file)
    os.rename(path + ".tmp", path)  # whole or not at all for the reader

def record(name, **facts):
    write_whole(os.path.join(FOLDER, name + ".json"), facts)

def wait_for(name):
    while not os.path.exists(os.path.join(FOLDER, name + ".json")):
        time.sleep(0.02)

record(f"{{attempt}}-{{k}}", pid=os.getpid(), tf_config=json.loads(os.environ["TF_CONFIG"]),
       cuda=os.environ.get("CUDA_VISIBLE_DEVICES"))
"""


class Job:
    """A worker script in a folder of its own, and the launcher that runs it."""

    def __init__(self, folder):
        self.folder = folder
        self.script = folder / "worker.py"
        self.bin = folder / "bin"  # a fake nvidia-smi comes first on the launcher's PATH
        self.bin.mkdir()
        self.gpus(0)

    def worker(self, body: str) -> None:
        """Writes the worker script: the prelude, then `body` (k and attempt known)."""
        prelude = WORKER_PRELUDE.format(folder=str(self.folder))
        self.script.write_text(prelude + textwrap.dedent(body))

    def gpus(self, number: int) -> None:
        """Makes the launcher's `nvidia-smi -L` list `number` GPUs."""
        listing = "".join(f"GPU {i}: Fake GPU (UUID: GPU-{i})\\n" for i in range(number))
        smi = self.bin / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
        smi.chmod(0o755)

    def start(self, *args: str, command: list[str] | None = None) -> subprocess.Popen:
        """Starts `strategykit launch ARGS -- python worker.py` (or `command`) in its own
        process group, in the job's folder."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("TF_CPP", "CUDA_VISIBLE"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.Popen(
            [sys.executable, "-m", "strategykit_console", "launch", *args,
             "--", *(command or [sys.executable, str(self.script)])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=self.folder,
            start_new_session=True)  # bytes: text mode would turn every \r into \n

    def finish(self, launcher: subprocess.Popen) -> subprocess.CompletedProcess:
        """Waits for the launcher; kills its process group and fails after TIMEOUT."""
        try:
            out, err = launcher.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            out, err = launcher.communicate()
            pytest.fail(f"strategykit launch still ran after {TIMEOUT} s:\n{out}\n{err}")
        return subprocess.CompletedProcess(launcher.args, launcher.returncode,
                                           out.decode(), err.decode())

    def run(self, *args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
        return self.finish(self.start(*args, command=command))

    def records(self) -> dict:
        """What each worker recorded, by name (`"<attempt>-<worker>"` for the prelude's)."""
        return {path.stem: json.loads(path.read_text()) for path in self.folder.glob("*.json")}

    def wait_for(self, *names: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not set(names) <= set(self.records()):
            if time.monotonic() > deadline:
                pytest.fail(f"workers did not record {names}: {sorted(self.records())}")
            time.sleep(0.05)

    def kill_leftovers(self) -> None:
        for facts in self.records().values():
            if "pid" in facts and alive(facts["pid"]):
                os.kill(facts["pid"], signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def job(tmp_path):
    job = Job(tmp_path)
    yield job
    job.kill_leftovers()


# The whole job, through the installed command.


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    """One job of 3 workers and 6 GPUs that writes a Keras-like progress bar; its result."""
    job = Job(tmp_path_factory.mktemp("three_workers"))
    job.gpus(6)
    job.worker("""
        print("Epoch 1/1")
        print("warning from", k, file=sys.stderr)
        shown = ""
        for step in range(1, 4):
            shown = "\\b" * len(shown) + f"\\r{step}/3 ━━━━━━ - loss: {step}.0"
            sys.stdout.write(shown + ("\\n" if step == 3 else ""))
            sys.stdout.flush()
            time.sleep(0.05)
        sys.stdout.write(f"last words of {k}")  # no line end
    """)
    result = job.run("--workers", "3")
    yield job, result
    job.kill_leftovers()


def test_each_worker_gets_its_tf_config_worker_index_and_gpus(three_workers):
    job, result = three_workers
    assert result.returncode == 0, result.stderr
    records = job.records()
    cluster = records["0-0"]["tf_config"]["cluster"]
    ports = [int(address.split(":")[1]) for address in cluster["worker"]]
    assert cluster["worker"] == [f"localhost:{port}" for port in ports]
    assert len(set(ports)) == 3
    for k in range(3):
        assert records[f"0-{k}"]["tf_config"] == {
            "cluster": cluster, "task": {"type": "worker", "index": k}}
    assert [records[f"0-{k}"]["cuda"] for k in range(3)] == ["0,1", "2,3", "4,5"]
    assert f"starting 3 workers on localhost, ports {', '.join(map(str, ports))}, in a " \
           "private network (reachable from this job only).\n" in result.stderr


def test_output_is_prefixed_and_only_the_chiefs_progress_bar_is_shown(three_workers):
    out, err = three_workers[1].stdout, three_workers[1].stderr
    assert "\b" not in out
    assert "\r[worker 0] 1/3 ━━━━━━ - loss: 1.0" in out
    assert "\r[worker 0] 3/3 ━━━━━━ - loss: 3.0\n" in out
    bars = [line for line in re.split(r"[\r\n]", out) if "━" in line]
    assert bars and all(line.startswith("[worker 0] ") for line in bars)
    for k in range(3):
        assert f"[worker {k}] Epoch 1/1\n" in out
        assert f"[worker {k}] last words of {k}\n" in out
        assert f"[worker {k}] warning from {k}\n" in err


def test_a_failed_worker_stops_the_others_at_once(job):
    job.worker("""
        if k == 0:
            signal.signal(signal.SIGTERM, lambda *_: (record("sigterm", time=time.time()),
                                                      sys.exit(1)))
            time.sleep(600)
        wait_for("0-0")
        record("failed", time=time.time())
        sys.exit(3)
    """)
    result = job.run("--workers", "2")
    ended = time.time()
    records = job.records()
    assert result.returncode == 3
    assert "strategykit launch: worker 1 exited with code 3; stopped the other 1 worker.\n" \
        in result.stderr
    assert records["sigterm"]["time"] - records["failed"]["time"] < 2
    assert ended - records["failed"]["time"] < 15
    assert not alive(records["0-0"]["pid"])


def test_a_worker_killed_by_a_signal_is_named_and_a_stubborn_group_is_killed(job):
    job.worker("""
        if k == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its child inherits that too
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            record("child", pid=child.pid)
            time.sleep(600)
        wait_for("child")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    started = time.time()
    result = job.run("--workers", "2")
    records = job.records()
    assert result.returncode == 128 + 9
    assert "strategykit launch: worker 1 was killed by signal SIGKILL (9); stopped the " \
           "other 1 worker.\n" in result.stderr
    assert time.time() - started >= launch_module.GRACE_SECONDS
    assert not alive(records["0-0"]["pid"])
    assert not alive(records["child"]["pid"])


def test_a_restart_runs_the_whole_job_again(job):
    job.worker("""
        if attempt == 0 and k == 0:
            time.sleep(600)
        if attempt == 0:
            wait_for("0-0")
            sys.exit(5)
    """)
    result = job.run("--workers", "2", "--restarts", "1")
    assert result.returncode == 0, result.stderr
    assert sorted(job.records()) == ["0-0", "0-1", "1-0", "1-1"]
    assert result.stderr.index("worker 1 exited with code 5; stopped the other 1 worker.") \
        < result.stderr.index("strategykit launch: restarting the job (restart 1 of 1).")


def test_a_job_that_keeps_failing_ends_after_its_restarts(job):
    job.worker("""
        if k == 0:
            time.sleep(600)
        wait_for(f"{attempt}-0")
        sys.exit(7)
    """)
    result = job.run("--workers", "2", "--restarts", "1", "--port", "23456")
    records = job.records()
    assert result.returncode == 7
    assert sorted(records) == ["0-0", "0-1", "1-0", "1-1"]
    assert result.stderr.count("worker 1 exited with code 7; stopped the other 1 worker.") == 2
    assert result.stderr.count("restarting the job") == 1
    assert {tuple(facts["tf_config"]["cluster"]["worker"]) for facts in records.values()} \
        == {("localhost:23456", "localhost:23457")}


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                          (signal.SIGHUP, 129)])
def test_a_signal_to_the_launcher_stops_every_worker(job, signum, code):
    # Each worker records the SIGTERM it gets (a closed terminal's SIGHUP included: the
    # workers, in sessions of their own, are told by the launcher), then exits.
    job.worker("""
        signal.signal(signal.SIGTERM, lambda *_: (record(f"sigterm-{k}"), sys.exit(0)))
        record(f"ready-{k}")
        time.sleep(600)
    """)
    launcher = job.start("--workers", "2")
    job.wait_for("ready-0", "ready-1")
    launcher.send_signal(signum)
    result = job.finish(launcher)
    assert result.returncode == code
    assert f"strategykit launch: received {signum.name}; stopped 2 workers.\n" in result.stderr
    assert {"sigterm-0", "sigterm-1"} <= set(job.records())
    assert not any(alive(facts["pid"]) for facts in job.records().values() if "pid" in facts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_by_sigkill_leaves_no_worker_running(job):
    job.worker("""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops this worker
        time.sleep(600)
    """)
    launcher = job.start("--workers", "2")
    job.wait_for("0-0", "0-1")
    pids = [job.records()[f"0-{k}"]["pid"] for k in range(2)]
    assert not kill_launcher(launcher, pids), "workers still running 10 s after it died"


def kill_launcher(launcher: subprocess.Popen, pids: list[int]) -> list[int]:
    """Kills the launcher with SIGKILL; those of `pids` still alive 10 s later."""
    os.kill(launcher.pid, signal.SIGKILL)
    killed = time.monotonic()
    launcher.communicate(timeout=TIMEOUT)
    while any(map(alive, pids)) and time.monotonic() - killed < 10:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def test_a_guarded_worker_is_the_command_itself_in_its_own_group(job):
    job.worker("""
        record("identity", group=os.getpgid(0), parent=os.getppid(), argv=sys.argv)
    """)
    launcher = job.start("--workers", "1")
    result = job.finish(launcher)
    assert result.returncode == 0, result.stderr
    identity, worker = job.records()["identity"], job.records()["0-0"]
    assert identity["group"] == worker["pid"]  # exec'd: the guard's pid, group and parent
    assert identity["argv"] == [str(job.script)]


def test_a_stopped_worker_is_named_and_the_hung_job_killed(job):
    # Each worker reports a step as `sk.from_env()` has it reported in a real job; then
    # worker 1 stops (SIGSTOP) and worker 0 waits for it, alive but without progress.
    # Written whole or not at all, as `sk.from_env()` writes it (a report read half-written
    # would look like a worker without a heartbeat).
    job.worker("""
        def report(**facts):
            write_whole(os.environ["STRATEGYKIT_PROGRESS_FILE"], facts)

        now = time.time()
        report(epoch=2, step=3 + k, progress=now, heartbeat=now)
        if k == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        while True:  # worker 0's heartbeat goes on
            time.sleep(0.2)
            report(epoch=2, step=3, progress=now, heartbeat=time.time())
    """)
    started = time.time()
    result = job.run("--workers", "2", "--hang-timeout", "4")
    assert result.returncode == 124, result.stderr
    assert "strategykit launch: worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) " \
           "after step 4 of epoch 2; no worker made progress for 4 s; stopped the job.\n" \
           in result.stderr
    assert time.time() - started < 30
    assert not any(alive(facts["pid"]) for facts in job.records().values())


@pytest.mark.slow
def test_a_stopped_worker_is_named_when_a_healthy_peer_fails_first(job, tmp_path):
    # TensorFlow ends the healthy worker about 10 s after the stopped one's last heartbeat,
    # long before a realistic hang timeout: the launcher names the stopped worker, and the
    # healthy one's traceback, which only echoes it, goes to a log file.
    lost = (b"E0000 00:00:1795653262.2 11083 base_collective_executor.cc:249] The following "
            b"tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1"
            b"\nThe tasks have crashed.\nTraceback (most recent call last):\n  File "
            b"\"train.py\", line 7, in <module>\ntensorflow.python.framework.errors_impl."
            b"UnavailableError: Collective ops is aborted\n")
    job.worker(f"""
        now = time.time()
        write_whole(os.environ["STRATEGYKIT_PROGRESS_FILE"],
                    dict(epoch=3, step=4, progress=now, heartbeat=now, calls=1))
        if k == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(1)
        sys.stderr.buffer.write({lost!r})
        sys.exit(1)
    """)
    result = job.run("--workers", "2")  # the default hang timeout: 300 s
    assert result.returncode == 124, result.stderr
    lines = result.stderr.splitlines()
    assert "strategykit launch: worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) " \
           "after step 4 of epoch 3; worker 0 then exited with code 1 (it lost worker 1); " \
           "stopped the other 1 worker." in lines
    assert "Traceback" not in result.stderr and "task:1" not in result.stderr
    log_line = lines[-1]
    assert log_line.startswith("strategykit launch: the error output of worker 0, which "
                               "follows from that, is in ")
    assert log_line.endswith("; --verbose shows it here.")
    log = log_line.split(" is in ")[1].split(";")[0]
    assert "UnavailableError: Collective ops is aborted" in open(log).read()
    assert os.path.basename(os.path.dirname(log)).startswith("strategykit-launch-")
    shutil.rmtree(os.path.dirname(log))  # the launcher's folder, kept for the log
    verbose = job.run("--verbose", "--workers", "2")
    assert verbose.returncode == 124
    assert "[worker 0] Traceback (most recent call last):" in verbose.stderr
    assert "error output" not in verbose.stderr


def test_the_traceback_of_a_worker_at_fault_is_shown_and_one_that_goes_on_too(job):
    job.worker("""
        if k == 0:
            print("Traceback (most recent call last):\\nKeyError: 'logged, then going on'",
                  file=sys.stderr, flush=True)
            time.sleep(8)
        else:
            time.sleep(0.5)
            raise ValueError("worker 1's own bug")
    """)
    result = job.run("--workers", "2")
    assert result.returncode == 1, result.stderr
    assert "[worker 1] ValueError: worker 1's own bug\n" in result.stderr
    assert "strategykit launch: worker 1 exited with code 1; stopped the other 1 worker.\n" \
           in result.stderr
    # Worker 0 was stopped by the launcher with its logged traceback still held: set aside.
    assert "KeyError" not in result.stderr
    assert "the error output of worker 0" in result.stderr
    log = result.stderr.split("which follows from that, is in ")[1].split(";")[0]
    shutil.rmtree(os.path.dirname(log))  # the launcher's folder, kept for the log
    # Worker 0 logs a traceback, completes a step, and waits until the test has seen the
    # traceback on the launcher's stderr: shown while the worker runs, not at its end.
    job.worker("""
        if k == 0:
            print("Traceback (most recent call last):\\nKeyError: 'logged, then going on'",
                  file=sys.stderr, flush=True)
            time.sleep(0.5)
            now = time.time()  # a training step after it, as sk.from_env() reports one
            write_whole(os.environ["STRATEGYKIT_PROGRESS_FILE"],
                        dict(epoch=1, step=1, progress=now, heartbeat=now, calls=1))
            deadline = time.time() + 20
            while not os.path.exists(os.path.join(FOLDER, "seen.json")):
                if time.time() > deadline:
                    sys.exit(3)
                time.sleep(0.05)
    """)
    launcher = job.start("--workers", "2")
    for line in launcher.stderr:  # bytes, as they come
        if b"KeyError: 'logged, then going on'" in line:
            (job.folder / "seen.json").write_text("{}")
            break
    result = job.finish(launcher)
    assert result.returncode == 0, result.stderr


# Bad arguments: exit code 2 and a message naming what was received and the fix.

BAD_ARGUMENTS = [
    (["--workers", "0", "--", "python"],
     r"at least 1 worker\. Received: workers=0\. Use --workers 1 or more\."),
    (["--workers", "2", "--restarts", "-1", "--", "python"],
     r"restarts cannot be negative\. Received: restarts=-1\. Use --restarts 0"),
    (["--workers", "2", "--"],
     r"no command to run\. Received: command=\[\]\. Put the command after --"),
    (["--workers", "2"], r"no command to run\."),
    (["--workers", "2", "--port", "65535", "--", "python"],
     r"Received: port=65535, workers=2\. Use --port from 1 to 65534, or leave --port out"),
    (["--workers", "2", "--port", "0", "--", "python"], r"Received: port=0, workers=2\."),
    (["--workers", "2", "--gpus-per-worker", "3", "--", "python"],
     r"2 workers x 3 GPUs need 6 GPUs, but 4 GPUs found \(CUDA_VISIBLE_DEVICES, else "
     r"nvidia-smi -L\)\. Received: gpus_per_worker=3, workers=2\. Use --gpus-per-worker "
     r"from 1 to 2, or --gpus-per-worker 0 to run the workers on the CPU\."),
    (["--workers", "2", "--gpus-per-worker", "-1", "--", "python"],
     r"gpus_per_worker cannot be negative\. Received: gpus_per_worker=-1, workers=2\."),
    (["--workers", "2", "--hang-timeout", "-1", "--", "python"],
     r"hang_timeout cannot be negative\. Received: hang_timeout=-1\. Use --hang-timeout S "
     r"for S seconds, or 0 to never stop a job that makes no progress\."),
    (["--workers", "1", "--", "no-such-program-strategykit"],
     r"cannot start 'no-such-program-strategykit': No such file or directory\. Received: "
     r"command=\['no-such-program-strategykit'\]\. Check the command after --\."),
]


@pytest.mark.parametrize("args, message", BAD_ARGUMENTS)
def test_a_bad_argument_exits_2_with_its_message(monkeypatch, capsys, args, message):
    monkeypatch.setattr(launch_module, "find_gpus", lambda: ["0", "1", "2", "3"])
    assert cli.main(["launch", *args]) == 2
    error = capsys.readouterr().err
    assert re.search("strategykit launch: error: .*" + message, error), error


@pytest.mark.parametrize("args, message", BAD_ARGUMENTS)
def test_launch_raises_on_a_bad_argument(monkeypatch, args, message):
    monkeypatch.setattr(launch_module, "find_gpus", lambda: ["0", "1", "2", "3"])
    parsed = cli.build_parser().parse_args(["launch", *args])
    with pytest.raises(ValueError, match=message):
        launch(parsed.worker_command[1:], workers=parsed.workers, restarts=parsed.restarts,
               port=parsed.port, gpus_per_worker=parsed.gpus_per_worker,
               hang_timeout=parsed.hang_timeout, network=parsed.network)


def test_launch_wants_a_network_it_knows():
    with pytest.raises(ValueError, match=r"unknown network\. Received: network='none'\. Use "
                       r"--network=private \(the default: the job's own, reachable from no "
                       r"other machine\) or --network=host \(this machine's network\)\."):
        launch(["python"], workers=2, network="none")


def test_launch_wants_the_command_as_a_list():
    with pytest.raises(ValueError, match=r"command must be a list: the program, then its "
                       r"arguments\. Received: command='python train\.py'\. Use e\.g\. "
                       r"\['python', 'train\.py'\]\."):
        launch("python train.py", workers=2)


def test_launch_from_python_with_fewer_gpus_than_workers(monkeypatch, capsys):
    monkeypatch.setattr(launch_module, "find_gpus", lambda: ["0"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    watchdog = threading.Timer(TIMEOUT, os.kill, (os.getpid(), signal.SIGTERM))
    watchdog.start()  # stops the launcher (exit 143) should it not end by itself
    try:
        code = launch([sys.executable, "-c", "import os; print(os.environ.get("
                                             "'CUDA_VISIBLE_DEVICES', 'unset'))"], workers=2)
    finally:
        watchdog.cancel()
    assert code == 0
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[worker 0] unset", "[worker 1] unset"]
    assert err.startswith("strategykit launch: 1 GPU for 2 workers: every worker sees every "
                          "GPU; --gpus-per-worker 0 runs the workers on the CPU.\n")


def test_a_worker_count_that_is_no_number_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["launch", "--workers", "two", "--", "python"])
    assert exit_info.value.code == 2
    assert "argument --workers: invalid int value: 'two'" in capsys.readouterr().err


def test_the_launcher_process_imports_neither_tensorflow_nor_keras():
    # `strategykit launch` only runs processes: without the package's __init__ (which
    # imports both for `sk.*`) it starts in a fraction of a second and holds ~16 MB.
    code = ("import sys, strategykit_console; "
            "code = strategykit_console.main(['launch', '--workers', '1', '--', "
            "sys.executable, '-c', 'pass']); "
            "print(code, sorted({'tensorflow', 'keras'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stderr


# What each worker gets.


@pytest.mark.parametrize("workers, per_worker, gpus, expected", [
    (2, None, 4, ["0,1", "2,3"]),
    (3, None, 4, ["0", "1", "2"]),  # GPU 3 stays idle
    (2, 1, 4, ["0", "1"]),
    (2, 0, 4, ["", ""]),  # on the CPU
    (2, None, 0, [None, None]),  # no GPU: CUDA_VISIBLE_DEVICES untouched
    (4, None, 2, [None] * 4),  # fewer GPUs than workers: every worker sees them all
])
def test_gpu_assignment(workers, per_worker, gpus, expected):
    assert gpu_assignment(workers, per_worker, [str(i) for i in range(gpus)]) == expected


def test_gpu_assignment_follows_the_launchers_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7,-1,2")
    assert gpu_assignment(2, None, find_gpus()) == ["3,5", "6,7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert find_gpus() == []


def test_gpus_are_counted_with_nvidia_smi_when_present(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_gpus() == []
    Job(tmp_path).gpus(2)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_gpus() == ["0", "1"]


def test_worker_env_keeps_the_users_environment():
    env = worker_env(0, 2, [1000], None, base={"PYTHONUNBUFFERED": "", "CUDA_VISIBLE_DEVICES": "4"})
    assert env["STRATEGYKIT_RESTART"] == "2" and env["STRATEGYKIT_WORKER"] == "0"
    assert env["PYTHONUNBUFFERED"] == "" and env["CUDA_VISIBLE_DEVICES"] == "4"
    assert worker_env(0, 0, [1000], "", base={})["CUDA_VISIBLE_DEVICES"] == ""


# The output of the workers, line by line.


def forwarded(*feeds: tuple[int, bytes]) -> tuple[str, str]:
    """What the launcher's stdout and stderr show after the workers' stdout chunks."""
    out, err = io.StringIO(), io.StringIO()
    terminal = Terminal(out, err)
    forwarders = {}
    for worker, chunk in feeds:
        forwarder = forwarders.setdefault(worker, LineForwarder(terminal, worker, "stdout"))
        forwarder.feed(chunk)
    for forwarder in forwarders.values():
        forwarder.close()
    return out.getvalue(), err.getvalue()


BAR = "━━".encode()


def test_the_chiefs_updates_are_redrawn_as_they_come_even_split_mid_character():
    out, _ = forwarded((0, b"\r1/2 " + BAR[:4]), (0, BAR[4:] + b" - loss"),
                       (0, b"\b" * 12 + b"\r2/2 " + BAR + b"\n"))
    # The update in progress goes on where it stopped: only its new part is written.
    assert out == ("\r[worker 0] 1/2 ━━ - loss"
                   "\r[worker 0] 2/2 ━━\n")


def test_another_workers_line_ends_the_chiefs_open_bar_first():
    out, _ = forwarded((0, b"\r1/2 " + BAR), (1, b"\r1/2 " + BAR + b"\b\b\r2/2 " + BAR),
                       (1, b"\nsaved\n"), (0, b"\r2/2 " + BAR + b"\n"))
    assert out == "\r[worker 0] 1/2 ━━\n[worker 1] saved\n\r[worker 0] 2/2 ━━\n"


def test_other_lines_are_never_lost():
    out, _ = forwarded((1, b"a\r\nb\n\ntqdm 50%\rtqdm 100%\r\n"), (0, b"x\r\ny\r"),
                       (1, b"no line end"))
    assert out == ("[worker 1] a\n[worker 1] b\n[worker 1] \n[worker 1] tqdm 50%\n"
                   "[worker 1] tqdm 100%\n\r[worker 0] x\n\r[worker 0] y\n"
                   "[worker 1] no line end\n")
    # The chief's last update stays on screen once, however its stream ends; of updates
    # that come together, only the last is drawn.
    assert forwarded((0, b"\r1/2\r2/2\r"))[0] == "\r[worker 0] 2/2\n"
    assert forwarded((0, b"\r1/2\r"), (0, b"2/2\r"))[0] == "\r[worker 0] 1/2\r[worker 0] 2/2\n"


@pytest.mark.parametrize("codes, failed", [
    ([None, None], None), ([0, None], None), ([None, 3], 1), ([1, -9], 1), ([-15, -9], 0),
    ([2, 1], 0),
])
def test_the_worker_named_is_the_likelier_cause(codes, failed):
    # A worker killed by a signal breaks its peers' collectives: they fail a moment later.
    assert launch_module._first_failed(codes) == failed


_TF_LOG_LINE = re.compile(r"^\[worker \d\] ([IWEF]\d{4} |WARNING: All log messages before absl)",
                          re.MULTILINE)


def test_with_verbose_workers_print_their_tensorflow_log_lines(tmp_path):
    # Importing TensorFlow and running an op prints C++ log lines (oneDNN, CUDA) that
    # TF_CPP_MIN_LOG_LEVEL alone does not silence; --verbose shows them as a worker prints
    # them. Without --verbose the launcher drops them, as the strategykit command itself
    # does: tests/guides/test_examples.py checks that in its run of the multi-worker example
    # (2 workers that import TensorFlow and train), and three_workers above that the
    # launcher keeps every other line of a worker's stderr. One worker is enough here: each
    # fresh process that imports TensorFlow costs about 9 s of CPU.
    job = Job(tmp_path)
    job.worker("""
        import tensorflow as tf
        print("sum", int(tf.constant(1) + 1), file=sys.stderr)
    """)
    verbose = job.run("--verbose", "--workers", "1")
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stderr.count("[worker 0] sum 2\n") == 1
    assert _TF_LOG_LINE.search(verbose.stderr), verbose.stderr


# The job's network: private by default, the machine's with --network=host.


def _outside_address() -> str:
    """This machine's address on its network (the interface of its default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        address = probe.getsockname()[0]
    assert not address.startswith("127."), f"no address but loopback: {address}"
    return address


def _reachable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("network, reachable", [(None, False), ("host", True)])
def test_a_workers_port_is_reachable_from_outside_the_job_only_on_the_hosts_network(
        job, network, reachable):
    # Each worker listens on its TF_CONFIG port on every interface, as TensorFlow's gRPC
    # server does, and checks that it reaches the other worker's port through localhost.
    job.worker("""
        import socket
        ports = [int(a.rsplit(":", 1)[1]) for a in json.loads(os.environ["TF_CONFIG"])[
            "cluster"]["worker"]]
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", ports[k]))
        server.listen()
        record(f"listening-{k}", port=ports[k])
        wait_for(f"listening-{1 - k}")  # the peer listens
        socket.create_connection(("localhost", ports[1 - k]), timeout=5).close()
        record(f"reached-{k}")
        wait_for("probed")
    """)
    launcher = job.start("--workers", "2", *(["--network", network] if network else []))
    try:
        job.wait_for("listening-0", "listening-1", "reached-0", "reached-1")
        port = job.records()["listening-0"]["port"]
        through = {"outside": _reachable(_outside_address(), port),
                   "this machine's loopback": _reachable("127.0.0.1", port)}
    finally:
        (job.folder / "probed.json").write_text("{}")
    result = job.finish(launcher)
    assert result.returncode == 0, result.stderr
    assert through == {"outside": reachable, "this machine's loopback": reachable}
    where = "on this machine's network" if network else \
        "in a private network (reachable from this job only)"
    assert f", {where}.\n" in result.stderr


def test_a_worker_that_reaches_out_of_the_private_network_is_told_the_flag(job):
    job.worker("""
        import urllib.request
        if k == 1:
            urllib.request.urlopen("https://pypi.org/simple/", timeout=10)
        time.sleep(30)
    """)
    result = job.run("--workers", "2")
    assert result.returncode == 1, result.stderr
    assert "URLError" in result.stderr  # the worker at fault: its traceback shown
    assert result.stderr.endswith(
        "strategykit launch: the job runs in a private network, where its workers cannot "
        "reach other machines (a download, an experiment tracker): run it with "
        "--network=host if it needs to (see the README, Security).\n")


def test_without_a_private_network_the_job_runs_on_the_machines_and_says_so(monkeypatch,
                                                                            capsys):
    def refused():
        raise launch_module.private_network.Unavailable("unshare: Operation not permitted")

    monkeypatch.setattr(launch_module.private_network, "start", refused)
    watchdog = threading.Timer(TIMEOUT, os.kill, (os.getpid(), signal.SIGTERM))
    watchdog.start()  # stops the launcher (exit 143) should it not end by itself
    try:
        code = launch([sys.executable, "-c", "print('trained')"], workers=2)
    finally:
        watchdog.cancel()
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("strategykit launch: no private network for the job here (unshare: "
                      "Operation not permitted): its workers' ports are open to other "
                      "machines, as with --network=host (see the README, Security).")
    assert err[1].endswith(", on this machine's network.")


def test_a_worker_whose_private_network_is_gone_does_not_start(tmp_path):
    guard = [sys.executable, launch_module.guarded.__code__.co_filename, str(os.getpid())]
    gone = subprocess.run([*guard, "999999999", "true"], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert gone.returncode == 126
    assert gone.stderr == ("strategykit launch: cannot join the job's private network: its "
                           "keeper (process 999999999) is gone\n")
