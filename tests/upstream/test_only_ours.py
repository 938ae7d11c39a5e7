"""strategykit's fixes touch only the strategies and data strategykit made.

A notebook that uses strategykit may train other Keras models too: on one device, or
under a `tf.distribute.MirroredStrategy` of its own. Those must run as if strategykit
were not imported, though its fixes are installed (`strategykit.made.strategies`).
Each workload (`other_models.py`) is one that a fix would change if it applied: gradient
clipping (clipped after the all-reduce), a loss reported through a `Mean` in a custom
`train_step` (multiplied by the replicas), synchronized batch norm, sample weights in the
loss and metrics, an activity regularizer, arrays with a partial final batch, and
strategykit's callbacks in every fit (`steps_per_execution` > 1 under a strategy fails in
Keras itself, with or without the fixes). Each runs with the fixes installed and again
with them removed: the weights, logs and callbacks must be the same, bit for bit.
Keras's own test files run with the fixes in use too (`strategykit_in_use`): their
results must be those without.
"""

import os
import pathlib
import subprocess
import sys
from xml.etree import ElementTree

import keras
import pytest


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mirrored", "one device"])
def test_other_models_train_as_without_strategykit(run_python, where):
    # In a process of its own: see other_models.py (collective keys).
    run_python(f"""
        import sys
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        from other_models import compare
        compare({where!r})
        """)


_KERAS_TESTS = [  # Keras's own test files of the parts the fixes replace code of
    "backend/tensorflow/distribute_test.py",
    "backend/tensorflow/optimizer_distribute_test.py",
    "layers/normalization/batch_normalization_test.py",
    "trainers/epoch_iterator_test.py",
    "trainers/trainer_test.py",
    "callbacks/callback_test.py",
]
# Of trainer_test.py, the fit(), evaluate() and predict() tests the fixes' code paths run
# through (the whole file takes minutes here; jax, torch and grain are not installed).
_CHOSEN = ("not TestTrainer or ((distribut or steps_per_execution or class_weight or "
           "sample_weight or metric) and not jit and not jax and not torch and not grain "
           "and not unrolled)")


def _run_keras_tests(tmp_path, arguments: list[str], *, with_strategykit: bool) -> dict:
    """Runs Keras's tests (pytest `arguments`) in a fresh process; returns `{test:
    "passed" | "failed" | "skipped"}`."""
    report = tmp_path / "report.xml"
    report.unlink(missing_ok=True)
    plugin = ["-p", "strategykit_in_use"] if with_strategykit else []
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-q",
                    f"--junitxml={report}", *arguments],
                   cwd=tmp_path, env=env, capture_output=True, timeout=600,
                   start_new_session=True)
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = (
            "failed" if tags & {"failure", "error"} else
            "skipped" if "skipped" in tags else "passed")
    return outcomes


@pytest.mark.slow
def test_keras_own_tests_pass_with_the_fixes_in_use_as_without(tmp_path):
    source = pathlib.Path(keras.__file__).parent / "src"
    if not all((source / name).is_file() for name in _KERAS_TESTS):
        pytest.skip(f"Keras {keras.__version__}'s wheel ships no test files (3.15.1's does)")
    arguments = [*(str(source / name) for name in _KERAS_TESTS), "-k", _CHOSEN]
    outcomes = _run_keras_tests(tmp_path, arguments, with_strategykit=True)
    assert sum(outcome == "passed" for outcome in outcomes.values()) > 60, outcomes  # they ran
    failed = sorted(test for test, outcome in outcomes.items() if outcome == "failed")
    if failed:  # each must fail without strategykit too (a package not installed)
        without = _run_keras_tests(tmp_path, arguments, with_strategykit=False)
        assert {test: without.get(test) for test in failed} == dict.fromkeys(
            failed, "failed"), failed
