"""CrossReplicaLoss(progress=...): what the progress bar shows, and that the logs keep all."""

import contextlib
import functools
import io

import keras
import numpy as np
import pytest

import strategykit as sk
from strategykit.callbacks.progress import shown_keys

from conftest import cpu_devices, progress_lines


def regressor():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    return model


@functools.cache
def strategy(replicas: int):
    return sk.mirrored(cpu_devices(replicas))


def data(replicas: int, **options):
    x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
    return sk.shard((x, x.sum(1)), strategy(replicas), global_batch_size=4 * replicas,
                    **options)


@functools.cache
def quietly_fitted(replicas: int):
    """A model on `replicas` replicas, traced by a first fit with verbose=0, and what that
    fit printed. The tests on a replica count share it: fit() again with a new callback
    (its bar and keys) traces nothing again (test_callbacks_reuse.py), so each shows its
    bar at the cost of its steps only. Only `test_verbose_zero_prints_nothing` needs the
    fresh model, since a first fit is when the steps are hooked and traced."""
    with strategy(replicas).scope():
        model = regressor()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        model.fit(data(replicas), epochs=1, verbose=0, shuffle=False,
                  callbacks=[sk.callbacks.CrossReplicaLoss()])
    return model, out.getvalue()


def fit_output(capsys, replicas, callbacks, **fit_options):
    model, _ = quietly_fitted(replicas)
    capsys.readouterr()
    history = model.fit(data(replicas), epochs=2, verbose=1, shuffle=False,
                        callbacks=callbacks, **fit_options)
    return capsys.readouterr().out, history, model


def test_default_shows_the_spread_with_four_replicas_and_keeps_every_key(capsys):
    out, history, _ = fit_output(capsys, 4, [sk.callbacks.CrossReplicaLoss()])
    final = progress_lines(out)[-1]
    assert final.startswith("3/3 ")  # 40 examples, global batch 16
    assert "- loss:" in final and "- mae:" in final
    assert "loss/min:" in final and "loss/max:" in final
    assert "loss/replica_0" not in final and "loss/mean" not in final
    assert "replica_drift" not in final
    assert len(final) <= 160
    assert out.count("Epoch 1/2") == 1  # one bar, not Keras's beside this one
    assert {"loss/replica_3", "loss/mean", "loss/std", "replica_drift"} <= set(history.history)


def test_two_replicas_show_every_key_by_default(capsys):
    out, _, _ = fit_output(capsys, 2, [sk.callbacks.CrossReplicaLoss()])
    final = progress_lines(out)[-1]
    assert "loss/replica_1:" in final and "loss/std:" in final and "replica_drift:" in final


# "all" on 4 replicas, where the default would hide the replicas' keys; the others on 2,
# where it would show every key (2 replicas trace half what 4 do).
@pytest.mark.parametrize(
    ("progress", "replicas", "shown", "hidden"),
    [
        ("all", 4, ["loss/replica_3:", "loss/mean:"], []),
        ("none", 2, [], ["loss/"]),
        (("loss/mean", "loss/replica_0"), 2, ["loss/mean:", "loss/replica_0:"],
         ["loss/replica_1", "loss/min"]),
    ],
)
def test_progress_chooses_the_keys(capsys, progress, replicas, shown, hidden):
    out, _, _ = fit_output(capsys, replicas,
                           [sk.callbacks.CrossReplicaLoss(progress=progress)])
    final = progress_lines(out)[-1]
    assert all(key in final for key in shown)
    assert not any(key in final for key in hidden)
    assert "- loss:" in final


def test_validation_keys_follow_their_names(capsys):
    # 2 replicas showing the spread, as 4 do by default, at half the tracing.
    out, history, _ = fit_output(capsys, 2, [sk.callbacks.CrossReplicaLoss(progress="spread")],
                                 validation_data=data(2, pad_remainder=False))
    final = progress_lines(out)[-1]
    assert "val_loss/min:" in final and "val_loss/max:" in final
    assert "val_loss/replica_0" not in final
    assert "val_loss/replica_1" in history.history


class AddsAKey(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        logs["later"] = 7.0

    def on_epoch_end(self, epoch, logs=None):
        logs["later"] = 7.0


def test_keys_of_callbacks_listed_later_reach_the_bar(capsys):
    # Keras's own bar runs after every callback; this one is first but shows them too.
    # 2 replicas: the bar defers its updates the same way whatever keys it shows.
    out, _, _ = fit_output(capsys, 2, [sk.callbacks.CrossReplicaLoss(), AddsAKey()])
    lines = progress_lines(out)
    assert all("later: 7.0" in line for line in lines if line.startswith("5/5"))
    assert "later: 7.0" in lines[0]


def test_the_same_callback_draws_evaluate_and_predict_bars_after_fit(capsys):
    # 2 replicas showing the spread, as 4 do by default, at half the tracing.
    callback = sk.callbacks.CrossReplicaLoss(progress="spread")
    _, _, model = fit_output(capsys, 2, [callback])
    x = np.random.default_rng(1).normal(size=(40, 3)).astype("float32")
    model.evaluate(sk.shard((x, x.sum(1)), strategy(2), global_batch_size=16,
                            pad_remainder=False), callbacks=[callback])
    evaluation = progress_lines(capsys.readouterr().out)
    assert evaluation[-1].startswith("3/3 ") and "loss/min:" in evaluation[-1]
    assert "loss/replica_0" not in evaluation[-1]
    model.predict(sk.shard(x, strategy(2), global_batch_size=16, pad_remainder=False),
                  callbacks=[callback])
    assert progress_lines(capsys.readouterr().out)[-1].startswith("3/3 ")


def test_verbose_zero_prints_nothing():
    # The shared 4-replica model's first fit, on the fresh model.
    assert quietly_fitted(4)[1] == ""


def test_eight_replicas_fit_a_terminal(run_python):
    # 8 replicas need 8 devices: a fresh process splits its CPU in 8.
    result = run_python("""
        import re, numpy as np, keras, strategykit as sk
        strategy = sk.mirrored(replicas=8)
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse", metrics=["mae"])
        model.fit(sk.shard((x, x.sum(1)), strategy, global_batch_size=16), epochs=1,
                  shuffle=False, callbacks=[sk.callbacks.CrossReplicaLoss()])
        print("KEYS", sorted(model.history.history))
    """)
    lines = progress_lines(result.stdout)
    assert lines[-1].startswith("4/4 ") and "loss/max:" in lines[-1]
    assert max(len(line) for line in lines) <= 160
    assert "'loss/replica_7'" in result.stdout


def test_shown_keys():
    assert shown_keys("auto", 1) is None and shown_keys("auto", 2) is None
    assert shown_keys("auto", 3) == {"loss/min", "loss/max"}
    assert shown_keys("spread", 2) == {"loss/min", "loss/max"}
    assert shown_keys("none", 8) == frozenset()
    assert shown_keys(["loss/std"], 8) == {"loss/std"}


@pytest.mark.parametrize("progress", ["some", 3, None, ["loss/mean", 1]])
def test_unknown_progress_is_an_error(progress):
    with pytest.raises(ValueError, match=r"progress must be one of 'auto', 'all', 'spread', "
                                         r"'none' or a list of keys\. Received: progress="):
        sk.callbacks.CrossReplicaLoss(progress=progress)
