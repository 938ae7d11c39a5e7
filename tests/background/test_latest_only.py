"""LatestOnly: a job off the caller's thread, for the latest value; its errors not lost."""

import threading

import pytest

from strategykit.background.latest_only import LatestOnly


def test_a_value_waiting_is_replaced_by_a_newer_one():
    ran, started, go_on = [], threading.Event(), threading.Event()

    def job(value):
        ran.append((value, threading.current_thread().name))
        started.set()
        go_on.wait(10)

    runner = LatestOnly(job, name="test-runner")
    runner.submit(1)
    assert started.wait(10)  # 1 runs; 2 waits, then 3 replaces it
    runner.submit(2)
    runner.submit(3)
    go_on.set()
    runner.wait()
    assert ran == [(1, "test-runner"), (3, "test-runner")]
    runner.submit(4)  # after a wait, a new thread takes the next value
    runner.wait()
    assert ran[-1] == (4, "test-runner")


def test_a_jobs_error_is_raised_by_wait_once():
    def job(value):
        raise ValueError(f"cannot take {value}")

    runner = LatestOnly(job, name="test-runner")
    runner.submit(1)
    with pytest.raises(ValueError, match="cannot take 1"):
        runner.wait()
    runner.wait()  # raised once
