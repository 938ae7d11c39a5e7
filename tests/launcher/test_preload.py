"""`strategykit launch --preload`: workers forked from a server that imported TensorFlow.

Each job here pays one TensorFlow import, in its preload server; the workers are tiny
Python scripts (what TensorFlow training under `--preload` does is tested by
tests/cluster/test_launch_resume.py). As in tests/launcher/test_launch.py, a launcher that
outlives its test's timeout is killed with its process group, and what is left of the
workers is killed at the end of each test.
"""

import sys

import pytest
from test_launch import Job, kill_launcher

from strategykit.launcher.launch import launch
from strategykit.launcher.preload import preloadable


@pytest.fixture
def job(tmp_path):
    job = Job(tmp_path)
    yield job
    job.kill_leftovers()


@pytest.mark.slow
def test_preloaded_workers_are_the_command_run_by_python_restarts_included(job):
    # `python -m worker` from the job's folder, 2 workers, 2 GPUs, two restarts: worker 1
    # fails in the first attempt with an exception, as `python -m worker` would; in the
    # second, worker 0 kills the server, which takes the workers with it, and the third
    # attempt gets a new server.
    job.gpus(2)
    job.worker("""
        import atexit, numpy
        preloaded = sorted({"tensorflow", "keras", "strategykit"} & set(sys.modules))
        record(f"identity-{attempt}-{k}", argv=sys.argv, run_name=__name__, path0=sys.path[0],
               preloaded=preloaded, group=os.getpgid(0), session=os.getsid(0),
               parent=os.getppid(), stdin=sys.stdin.read(), random=numpy.random.rand())
        atexit.register(lambda: record(f"atexit-{attempt}-{k}"))
        if attempt == 1 and k == 0:
            wait_for("identity-1-1")
            os.kill(os.getppid(), signal.SIGKILL)
        if attempt < 2 and k == 0 or attempt == 1:
            time.sleep(600)
        if attempt == 0:
            wait_for("identity-0-0")
            raise RuntimeError("worker 1 fails")
    """)
    result = job.run("--workers", "2", "--restarts", "2", "--preload",
                     command=[sys.executable, "-m", "worker", "--epochs", "3"])
    assert result.returncode == 0, result.stderr
    records = job.records()
    runs = [(attempt, k) for attempt in (0, 1, 2) for k in (0, 1)]
    identities = [records[f"identity-{attempt}-{k}"] for attempt, k in runs]
    for identity, (attempt, k) in zip(identities, runs):
        assert identity["argv"] == [str(job.script), "--epochs", "3"]
        assert identity["run_name"] == "__main__" and identity["path0"] == str(job.folder)
        assert identity["preloaded"] == ["keras", "strategykit", "tensorflow"]
        assert identity["group"] == identity["session"] == records[f"{attempt}-{k}"]["pid"]
        assert identity["stdin"] == ""
    assert [records[f"0-{k}"]["cuda"] for k in (0, 1)] == ["0", "1"]
    assert records["2-1"]["tf_config"]["task"] == {"type": "worker", "index": 1}
    # One server forked the workers of the first two attempts, a new one the third's;
    # each worker drew its own numbers.
    parents = [identity["parent"] for identity in identities]
    assert len(set(parents[:4])) == 1 and len(set(parents[4:])) == 1
    assert parents[0] != parents[4]
    assert len({identity["random"] for identity in identities}) == 6
    assert {"atexit-0-1", "atexit-2-0", "atexit-2-1"} <= set(records)
    assert not {"atexit-1-0", "atexit-1-1"} & set(records)  # killed with the server
    # Worker 1's traceback shows its own frames only, as `python -m worker` shows them.
    assert "worker 1 exited with code 1; stopped the other 1 worker." in result.stderr
    traceback = result.stderr.split("[worker 1] Traceback (most recent call last):\n")[1]
    assert traceback.startswith(f'[worker 1]   File "{job.script}", line ')
    assert "[worker 1] RuntimeError: worker 1 fails\n" in traceback
    assert "preload_server" not in traceback and "runpy" not in traceback
    assert f"strategykit launch: the preload server (pid {parents[0]}) ended during the " \
           "job, and its workers with it.\n" in result.stderr
    assert "restarting the job (restart 2 of 2)" in result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_by_sigkill_leaves_neither_server_nor_worker_running(job):
    job.worker("""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops this worker
        record(f"parent-{k}", pid=os.getppid())
        time.sleep(600)
    """)
    launcher = job.start("--workers", "2", "--preload")
    job.wait_for("parent-0", "parent-1")
    records = job.records()
    pids = [records[f"0-{k}"]["pid"] for k in range(2)] + [records["parent-0"]["pid"]]
    assert not kill_launcher(launcher, pids), "server or workers running 10 s after it died"


def test_only_python_scripts_and_modules_are_preloadable():
    assert preloadable(["python", "train.py"])
    assert preloadable(["/opt/venv/bin/python3.11", "-m", "trainer", "--epochs", "2"])
    assert not preloadable(["python", "-c", "print(1)"])
    assert not preloadable(["python", "-m"])
    assert not preloadable(["python"])
    assert not preloadable(["bash", "train.sh"])
    with pytest.raises(ValueError, match=r"--preload forks Python workers: the command must be "
                       r"`python SCRIPT ARGS\.\.\.` or `python -m MODULE ARGS\.\.\.`\. "
                       r"Received: command=\['bash', 'train\.sh'\]\. Leave --preload out"):
        launch(["bash", "train.sh"], workers=2, preload=True, network="host")


def test_a_python_that_cannot_preload_is_named_with_its_error(job):
    python = job.bin / "python3.99"  # a Python without strategykit, as it would fail
    python.write_text("#!/bin/sh\necho \"No module named 'strategykit'\" >&2\nexit 1\n")
    python.chmod(0o755)
    job.worker("pass")
    result = job.run("--workers", "2", "--preload", command=["python3.99", str(job.script)])
    assert result.returncode == 2
    assert result.stderr.startswith("strategykit launch: error: the preload server ended: it "
                                    "imports TensorFlow, Keras and strategykit with the "
                                    "command's Python, 'python3.99', before forking the "
                                    "workers. Its output:\nNo module named 'strategykit'\n"
                                    "Leave --preload out, or install strategykit for that "
                                    "Python.\n"), result.stderr
    assert not [name for name in job.records() if name.startswith("0-")]
