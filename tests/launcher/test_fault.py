"""Which worker the launcher names when a job fails: the one at fault, not the first of
its peers to notice (hand-written exit codes, process states, reports and TensorFlow
error output; the real jobs are in test_launch.py and test_launch_resume.py)."""

import io

from strategykit.launcher.fault import blame
from strategykit.launcher.worker_output import LineForwarder, Terminal

REPORTS = [{"epoch": 3, "step": 5}, {"epoch": 3, "step": 4}, {}]

# What worker 0 of a real job printed when worker 1 was stopped with SIGSTOP: TensorFlow's
# C++ log line, then its Python traceback (shortened).
TENSORFLOW_LOST_WORKER_1 = (
    b"E0000 00:00:1795653262.1 11083 coordination_service_agent.cc:332] Polled an error "
    b"from coordination service (this can be an error from this or another task).\n"
    b"E0000 00:00:1795653262.2 11083 base_collective_executor.cc:249] The following tasks "
    b"are unhealthy (stopped sending heartbeats):\n"
    b"/job:worker/replica:0/task:1\n"
    b"The tasks have crashed. Check the task logs for an earlier error.\n"
    b"Traceback (most recent call last):\n"
    b'  File "/tmp/train.py", line 77, in <module>\n'
    b"tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:\n"
    b"Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
    b"tasks are unhealthy (stopped sending heartbeats):\n"
    b"/job:worker/replica:0/task:1\n"
)


def test_a_stopped_peer_is_at_fault_not_the_worker_that_noticed():
    fault = blame(failed=0, codes=[1, None, None], states=["exited", "T", "S"],
                  reports=REPORTS, unhealthy={0: [1]})
    assert (fault.worker, fault.code) == (1, 124)  # a hang, as the hang watch reports one
    assert fault.message == (
        "worker 1 is stopped (process state T: a SIGSTOP or Ctrl-Z) after step 4 of epoch 3; "
        "worker 0 then exited with code 1 (it lost worker 1)")


def test_the_worker_tensorflow_names_unhealthy_is_at_fault():
    # Worker 2 died first but was seen in the same poll as worker 0, which named it.
    fault = blame(failed=0, codes=[1, None, -9], states=["exited", "S", "exited"],
                  reports=REPORTS, unhealthy={0: [2]})
    assert (fault.worker, fault.code) == (2, 137)
    assert fault.message == ("worker 2 was killed by signal SIGKILL (9); worker 0 then exited "
                             "with code 1 (it lost worker 2)")
    # Named unhealthy while its process runs (a network partition, say).
    fault = blame(failed=0, codes=[1, None, None], states=["exited", "S", "R"],
                  reports=REPORTS, unhealthy={0: [1]})
    assert (fault.worker, fault.code) == (1, 1)
    assert fault.message == ("worker 1 stopped sending TensorFlow's heartbeats (running) after "
                             "step 4 of epoch 3; worker 0 then exited with code 1 (it lost "
                             "worker 1)")


def test_without_other_evidence_the_failed_worker_is_at_fault():
    fault = blame(failed=1, codes=[None, 3, None], states=["S", "exited", "S"],
                  reports=REPORTS, unhealthy={1: [1], 0: [2]})  # only its own error counts
    assert (fault.worker, fault.code, fault.message) == (1, 3, "worker 1 exited with code 3")
    fault = blame(failed=2, codes=[None, None, -15], states=["S", "S", "exited"],
                  reports=REPORTS, unhealthy={})
    assert (fault.worker, fault.code) == (2, 143)
    assert fault.message == "worker 2 was killed by signal SIGTERM (15)"


def _forwarder(hold=True, worker=0):
    out, err = io.StringIO(), io.StringIO()
    return LineForwarder(Terminal(out, err), worker, "stderr", hold_tracebacks=hold), err


def test_tensorflows_unhealthy_tasks_are_read_from_a_workers_error_output():
    forwarder, _ = _forwarder()
    for chunk in (TENSORFLOW_LOST_WORKER_1[:150], TENSORFLOW_LOST_WORKER_1[150:]):
        forwarder.feed(chunk)  # split anywhere, as a pipe delivers it
    forwarder.close()
    assert forwarder.unhealthy_workers == [1]


def test_a_traceback_is_held_until_released_or_taken():
    forwarder, err = _forwarder()
    forwarder.feed(TENSORFLOW_LOST_WORKER_1)
    shown = err.getvalue()
    assert "Polled an error" in shown  # before the task list: shown as it comes
    assert "task:1" not in shown and "Traceback" not in shown and "UnavailableError" not in shown
    assert forwarder.held_since is not None
    held = forwarder.take_held()
    assert held[:2] == ["/job:worker/replica:0/task:1", "The tasks have crashed. Check the "
                                                        "task logs for an earlier error."]
    assert "UnavailableError" in held[-3]
    assert err.getvalue() == shown and forwarder.held_since is None

    forwarder, err = _forwarder()
    forwarder.feed(b"ValueError at first\nTraceback (most recent call last):\nValueError: x\n")
    forwarder.release()
    forwarder.feed(b"after\n")
    assert err.getvalue() == ("[worker 0] ValueError at first\n[worker 0] Traceback (most "
                              "recent call last):\n[worker 0] ValueError: x\n[worker 0] after\n")
    assert forwarder.take_held() == []


def test_with_verbose_nothing_is_held():
    forwarder, err = _forwarder(hold=False)
    forwarder.feed(TENSORFLOW_LOST_WORKER_1)
    assert err.getvalue().count("[worker 0] ") == TENSORFLOW_LOST_WORKER_1.count(b"\n")
    assert forwarder.unhealthy_workers == [1]
