"""LossPlot: each replica's loss and the mean, saved as PNG or updated in place in Jupyter."""

import threading
import time

import IPython.display
import keras
import matplotlib.pyplot as plt
import numpy as np
import pytest

from strategykit import callbacks
from strategykit.callbacks.loss_plot import LossPlot, plotted_keys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def small_model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def data():
    y = np.arange(8, dtype="float32")[:, None]
    return np.ones_like(y), y


def test_plots_every_replica_and_the_mean_and_saves_a_png(make_strategy, tmp_path):
    model = small_model(make_strategy(2))
    plot = callbacks.LossPlot(path=tmp_path / "out" / "loss.png", show=False)
    history = model.fit(*data(), batch_size=4, epochs=3, verbose=0, validation_data=data(),
                        callbacks=[callbacks.CrossReplicaLoss(), plot]).history
    assert sorted(plot.history) == ["loss/mean", "loss/replica_0", "loss/replica_1",
                                    "val_loss/mean", "val_loss/replica_0",
                                    "val_loss/replica_1"]
    for key, values in plot.history.items():
        assert values == pytest.approx(history[key])
    assert (tmp_path / "out" / "loss.png").read_bytes().startswith(PNG_MAGIC)
    assert plt.get_fignums() == []  # its own Agg figure: pyplot's state is untouched


def test_the_file_is_drawn_off_the_training_thread_and_is_the_last_epochs_at_return(
        make_strategy, tmp_path, monkeypatch):
    drawn_on = []
    render = callbacks.LossPlot.render

    def slow(self, history=None):
        drawn_on.append(threading.current_thread().name)
        time.sleep(0.5)  # slower than an epoch: a plot waiting is replaced by a newer one
        return render(self, history)

    monkeypatch.setattr(callbacks.LossPlot, "render", slow)
    model = small_model(make_strategy(2))
    plot = callbacks.LossPlot(path=tmp_path / "loss.png", show=False)
    model.fit(*data(), batch_size=4, epochs=4, verbose=0,
              callbacks=[callbacks.CrossReplicaLoss(), plot])
    assert set(drawn_on) == {"strategykit-loss-plot"} and len(drawn_on) < 4
    assert (tmp_path / "loss.png").read_bytes() == render(plot)  # all 4 epochs


def test_an_error_drawing_the_file_is_raised_by_fit(make_strategy, tmp_path, monkeypatch):
    def broken(self, history=None):
        raise RuntimeError("no room left on the disk")

    monkeypatch.setattr(callbacks.LossPlot, "render", broken)
    model = small_model(make_strategy(2))
    with pytest.raises(RuntimeError, match="no room left on the disk"):
        model.fit(*data(), batch_size=4, epochs=2, verbose=0,
                  callbacks=[callbacks.LossPlot(path=tmp_path / "loss.png", show=False)])


def test_without_cross_replica_loss_it_plots_keras_loss(make_strategy, tmp_path):
    model = small_model(make_strategy(2))
    plot = callbacks.LossPlot(path=tmp_path / "loss.png", show=False)
    history = model.fit(*data(), batch_size=4, epochs=2, verbose=0, callbacks=[plot]).history
    assert plot.history == {"loss": pytest.approx(history["loss"])}
    assert (tmp_path / "loss.png").read_bytes().startswith(PNG_MAGIC)


def test_in_a_notebook_one_output_is_updated_in_place(make_strategy, monkeypatch):
    shown = []

    class Handle:
        def update(self, image):
            shown.append(("update", image.data))

    def display(image, display_id=None):
        shown.append(("display", image.data))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    model = small_model(make_strategy(2))
    model.fit(*data(), batch_size=4, epochs=3, verbose=0,
              callbacks=[callbacks.CrossReplicaLoss(), callbacks.LossPlot(show=True)])
    assert [kind for kind, _ in shown] == ["display", "update", "update"]
    assert all(png.startswith(PNG_MAGIC) for _, png in shown)


def test_plotted_keys():
    logs = {"loss": 1.0, "loss/replica_0": 1.0, "loss/replica_1": 2.0, "loss/mean": 1.5,
            "loss/max": 2.0, "val_loss": 3.0, "accuracy": 0.5}
    assert plotted_keys(logs) == ["loss/replica_0", "loss/replica_1", "loss/mean", "val_loss"]


def test_plotted_keys_of_a_step_reporting_several_losses():
    # A GAN's CrossReplicaLoss keys: without them LossPlot plotted nothing (no `loss`).
    logs = {"d_loss": 0.7, "g_loss": 0.6, "d_loss/replica_0": 0.7, "d_loss/replica_1": 0.8,
            "d_loss/mean": 0.75, "g_loss/replica_0": 0.6, "g_loss/replica_1": 0.5,
            "g_loss/mean": 0.55, "d_loss/max": 0.8}
    assert plotted_keys(logs) == ["d_loss/replica_0", "d_loss/replica_1", "g_loss/replica_0",
                                  "g_loss/replica_1", "d_loss/mean", "g_loss/mean"]
    assert LossPlot().render({key: [logs[key]] for key in plotted_keys(logs)})[:4] == (
        b"\x89PNG")


def test_invalid_show_is_refused():
    with pytest.raises(ValueError, match=r"show must be 'auto', True or False\. Received: "
                                         r"show='yes'"):
        callbacks.LossPlot(show="yes")
