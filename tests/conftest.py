"""The multi-device set-up of the suite: 4 logical CPU devices before TensorFlow starts.

TensorFlow fixes its device list once per process, so this runs before any test module
imports TensorFlow. Tests build strategies over `/cpu:0` .. `/cpu:N-1` with the
`strategy` fixture; tests of code that itself configures devices use `run_python` to run
in a fresh process.
"""

import contextlib
import gc
import os
import re
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One thread per TensorFlow op, here and in every process a test starts (workers, kernels,
# commands): 3 test processes and their workers share 2 cores, where each process's pool of
# a thread per core only adds switching. The suite used 1206 s of CPU against 1418 s
# (12:01 against 12:25, the machine as slow in both), and every test passes with it. The
# README demo's test runs without it, as a user's demo.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import pytest  # noqa: E402
from slow_first import slow_tests_first  # noqa: E402


@contextlib.contextmanager
def _stderr_silenced():
    """File descriptor 2 to /dev/null: TensorFlow's C++ start-up lines ignore
    TF_CPP_MIN_LOG_LEVEL, and pytest-xdist's workers import this file before pytest
    captures their output, so they would reach the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one test process per core and one more, at most 4. Many tests wait on
    worker processes, timeouts or kernels; the extra process uses a core meanwhile
    (measured on 2 cores: 11 min 25 s against 12 min 11 s with one per core; later
    17 min 44 s against 20 min 03 s with two more, which used 15% more CPU)."""
    return min(4, (os.cpu_count() or 1) + 1)


def pytest_collection_modifyitems(config, items):
    """Each test process begins its share with the tests marked `slow` (`slow_first`)."""
    processes = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = slow_tests_first(items, processes,
                                is_slow=lambda item: item.get_closest_marker("slow"),
                                module_of=lambda item: item.path)


LOGICAL_CPUS = 4

with _stderr_silenced():
    import tensorflow as tf

    _cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)]
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import strategykit as sk  # noqa: E402

# Each test process runs several hundred tests, whose models and traced functions the
# cyclic garbage collector's full passes walk again and again: the imported modules are
# frozen out of them, and a full pass comes after 100 of the middle generation's, not 10
# (measured on tests/equivalence and tests/callbacks in one process: 14.2 s of garbage
# collection, 12.2 s of it full passes, against 7.7 s and 5.8 s).
gc.freeze()
gc.set_threshold(700, 10, 100)


@pytest.fixture
def float64():
    """Keras's floatx and dtype policy float64 for the test (losses too), then as before."""
    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx(previous[0])
    keras.config.set_dtype_policy(previous[1])


def restorer(model):
    """A function that sets `model` back to its state of now and returns it: its weights
    (moving statistics included) and its optimizer's variables (step count, moments,
    accumulators; build it first, in the model's strategy scope). For tests that share one
    traced model, each starting it as a new one would start."""
    weights = model.get_weights()
    optimizer_values = [variable.numpy() for variable in model.optimizer.variables]

    def restore():
        model.set_weights(weights)
        for variable, value in zip(model.optimizer.variables, optimizer_values, strict=True):
            variable.assign(value)
        return model

    return restore


def reference_runs_eagerly() -> bool:
    """`compile(run_eagerly=...)` for a model compiled in the current strategy's scope:
    True for the one-device reference (the same computation untraced, which saves a test
    the reference's tracing), False under several replicas, traced as a user's steps are."""
    return tf.distribute.get_strategy().num_replicas_in_sync == 1


def assert_same_as_one_device(model, one, numbers: dict, one_numbers: dict, *,
                              atol: float = 1e-10, rtol: float = 1e-10):
    """`model` (trained on N replicas) has `one`'s weights within `atol`, and the numbers
    it reported (`{name: value or list}`, a history or evaluate()'s dict) are `one`'s
    within `rtol`, name for name."""
    for weight, expected in zip(model.weights, one.weights, strict=True):
        np.testing.assert_allclose(np.asarray(weight), np.asarray(expected), rtol=0,
                                   atol=atol, err_msg=weight.path)
    assert numbers.keys() == one_numbers.keys()
    for name, values in one_numbers.items():
        np.testing.assert_allclose(numbers[name], values, rtol=rtol, err_msg=name)


def bn_regressor(seed: int = 0):
    """A compiled Dense(4) -> BatchNormalization -> Dense(1) regressor on 3 inputs."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


class ZeroSubclassed(keras.Model):
    """A subclassed model y = w x, one weight starting at 0 (so it predicts 0 at first)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")

    def call(self, x):
        return self.dense(x)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_BAR = re.compile(r"\s*\d+/(\d+|Unknown) ")


def progress_lines(text: str) -> list[str]:
    """Keras progress bar lines in printed output, every redraw, colourless."""
    lines = re.split(r"[\r\n\b]+", _COLOUR.sub("", text))
    return [line for line in lines if _BAR.match(line)]


def final_progress_lines(text: str) -> list[str]:
    """The progress bar lines a terminal keeps at the end: each bar's last redraw.

    A bar redraws its line (after "\\r") at each step; a finished bar ends it with "\\n".
    """
    kept = [re.split(r"[\r\b]+", line)[-1] for line in _COLOUR.sub("", text).split("\n")]
    return [line for line in kept if _BAR.match(line)]


def cpu_devices(replicas: int) -> list[str]:
    """The names of the first `replicas` logical CPU devices."""
    return [f"/cpu:{i}" for i in range(replicas)]


@pytest.fixture
def make_strategy():
    """Builds a MirroredStrategy over the first N logical CPUs: `make_strategy(2)`."""
    return lambda replicas: sk.mirrored(cpu_devices(replicas))


@pytest.fixture
def run_python(tmp_path):
    """Runs Python source in a process of its own; returns the CompletedProcess.

    The process has not started TensorFlow's runtime (no device list, no context) and has
    none of the suite's logical devices, so it sees the machine as a user's script does
    before its first TensorFlow call. It is forked from the test process's fork server
    (`forked_workers`), which has imported TensorFlow, Keras and strategykit already: a
    process started the ordinary way spends about 8 s of CPU on that here. Raises
    AssertionError with the output when it fails, unless `check=False`, or when it runs
    longer than `timeout` seconds (its process group is killed).
    """
    from workers import run_processes

    def run(source: str, *, check: bool = True, env: dict | None = None, timeout: int = 300):
        script = tmp_path / "script.py"
        script.write_text(textwrap.dedent(source))
        full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        [ended] = run_processes(str(script), [full_env], timeout=timeout, check=False)
        if check and ended.returncode != 0:
            raise AssertionError(f"script failed:\n{ended.stdout}\n{ended.stderr}")
        return subprocess.CompletedProcess([sys.executable, str(script)], ended.returncode,
                                           ended.stdout, ended.stderr)

    return run
