"""On upstream code it was not checked on, a fix refuses where it is needed and nothing
else changes: an unseen Keras is simulated by replacing one pinned private method with
one of other source."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import upstream
from strategykit.cli import info
from strategykit.pinning import fix as fix_module

_PINNED = "keras.src.optimizers.base_optimizer:BaseOptimizer"


@pytest.fixture
def unseen_keras(monkeypatch):
    """BaseOptimizer._backend_reset_gradient_accumulators (which only the accumulation fix
    relies on) replaced by a function that behaves the same but has other source, then
    the fixes reinstalled."""
    owner = upstream.resolve(_PINNED)
    keras_reset = owner._backend_reset_gradient_accumulators

    def _backend_reset_gradient_accumulators(self):  # the same behaviour, other source
        return keras_reset(self)

    upstream.uninstall()
    monkeypatch.setattr(owner, "_backend_reset_gradient_accumulators",
                        _backend_reset_gradient_accumulators)
    monkeypatch.setattr(upstream, "_warned", [False])
    try:
        yield
    finally:
        upstream.uninstall()
        monkeypatch.undo()
        upstream.install()


def _fit(strategy, accumulation=None):
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=accumulation),
                      "mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def test_an_unknown_version_warns_once_in_one_line_naming_what_refuses(unseen_keras):
    with pytest.warns(upstream.UpstreamVersionWarning) as caught:
        upstream.install()
        upstream.install()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "\n" not in message
    assert f"TensorFlow {tf.__version__} + Keras {keras.__version__}" in message
    assert upstream.CHECKED_ON in message
    assert "gradient_accumulation_steps under a tf.distribute strategy" in message
    assert "Everything else works" in message
    states = {entry["replaces"].rpartition(".")[2]: entry for entry in upstream.status()
              if entry["replaces"]}
    assert states["_backend_apply_gradients"]["state"] == "refusing"
    assert list(states["_backend_apply_gradients"]["unknown"]) == [
        f"{_PINNED}._backend_reset_gradient_accumulators"]
    assert {entry["state"] for name, entry in states.items()
            if name != "_backend_apply_gradients"} <= {"installed", "not needed"}
    assert {entry["state"] for entry in upstream.status() if not entry["replaces"]} == {
        "checked"}
    listed = info._fixes_text({"checked_on": upstream.CHECKED_ON, "fixes": upstream.status()})
    assert ("  REFUSES (unknown upstream code): gradient_accumulation_steps under a "
            f"tf.distribute strategy (keras-team/keras#20582)\n      differs: {_PINNED}."
            "_backend_reset_gradient_accumulators\n  installed: fit() across") in listed


def test_the_affected_feature_refuses_and_the_rest_trains_as_one_device(unseen_keras):
    with pytest.warns(upstream.UpstreamVersionWarning):
        upstream.install()
    strategy = sk.mirrored(replicas=2)  # a strategy of strategykit's: where its fixes act
    with pytest.raises(upstream.UnknownUpstreamCode, match=(
            r"strategykit cannot make gradient_accumulation_steps under a tf.distribute "
            rf"strategy work on TensorFlow {tf.__version__} \+ Keras {keras.__version__}: "
            r"its fix for keras-team/keras#20582 relies on private upstream code that "
            r"differs .*BaseOptimizer._backend_reset_gradient_accumulators\. Rather than "
            r"train differently, it refuses\. Install a checked pair")):
        _fit(strategy, accumulation=2)
    # Without accumulation nothing depends on that fix: 2 replicas as one device.
    np.testing.assert_allclose(_fit(strategy)[0], _fit(tf.distribute.get_strategy())[0],
                               atol=1e-6)
    # One device with accumulation: Keras's own code, which needs no fix.
    _fit(tf.distribute.get_strategy(), accumulation=2)


def test_the_guard_is_removed_and_the_fix_installed_once_the_code_is_known(unseen_keras):
    with pytest.warns(upstream.UpstreamVersionWarning):
        upstream.install()
    accumulation = next(fix for fix in upstream.FIXES if fix.issue == "keras-team/keras#20582")
    assert accumulation.state() == "refusing" and not accumulation.installed()
    upstream.uninstall()
    assert accumulation.state() == "not installed"
    assert fix_module._ORIGINALS == {}


def test_a_fix_without_a_guard_leaves_upstream_own_code_and_says_so(monkeypatch):
    # pythonify_logs of other source: neither the code the fix knows nor Keras's fixed one.
    module = upstream.resolve("keras.src.utils.python_utils")
    keras_pythonify = module.pythonify_logs

    def pythonify_logs(logs):  # the same behaviour, other source
        return keras_pythonify(logs)

    upstream.uninstall()
    monkeypatch.setattr(module, "pythonify_logs", pythonify_logs)
    monkeypatch.setattr(upstream, "_warned", [False])
    try:
        with pytest.warns(upstream.UpstreamVersionWarning, match=(
                r"so these work as upstream's own code does: metrics whose result\(\) "
                r"returns a variable, under a strategy\. Everything else works")):
            upstream.install()
        entry = next(e for e in upstream.status() if e["issue"] == "keras-team/keras@3.12.0")
        assert entry["state"] == "upstream's own"
        assert module.pythonify_logs is pythonify_logs  # nothing replaced
    finally:
        upstream.uninstall()
        monkeypatch.undo()
        upstream.install()
