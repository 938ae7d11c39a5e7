"""`LossPlot`: a live plot of each replica's loss and the mean, in Jupyter or as a PNG."""

from __future__ import annotations

import io
import os
import pathlib
import re

import keras

from strategykit.background.latest_only import LatestOnly
from strategykit.cluster.roles import is_chief

_REPLICA_KEY = re.compile(r"^(val_)?([^/]+)/replica_(\d+)$")


class LossPlot(keras.callbacks.Callback):
    """Plots each replica's loss and the mean loss at every epoch end.

    Reads the `loss/replica_<k>` and `loss/mean` keys that `CrossReplicaLoss` puts into
    the logs (list `CrossReplicaLoss` first), and those of every other loss a custom
    step reports (a GAN's `d_loss/...` and `g_loss/...`); without them it plots Keras's
    `loss`.
    Validation losses are drawn dashed. In Jupyter the plot updates in place in the cell
    output; when `path` is given the PNG file is rewritten after every epoch (by the
    chief only, when training runs on several workers: `sk.is_chief()`). Outside a
    notebook the file is drawn on a thread of its own, so training does not wait for it
    (a plot still being drawn when the next epoch ends is replaced by the newer one), and
    it holds the last epoch's plot when `fit()` returns. It draws on its own matplotlib
    figure with the non-interactive Agg canvas, so it never opens a window and leaves
    pyplot's state alone.

    Args:
        path: where to save the PNG, or None (default) for no file.
        show: display the plot in a notebook: `"auto"` (default: when running in
            Jupyter), True or False.
        title: the plot's title. Default `"Loss per replica"`.

    Raises:
        ValueError: `path` not a path or None, or `show` not `"auto"`, True or False.

    Attributes:
        history: `{key: [value per epoch]}` of every loss key plotted.

    Example:
        >>> import strategykit as sk
        >>> plot = sk.callbacks.LossPlot(path="loss.png")
        >>> model.fit(data, epochs=5,
        ...           callbacks=[sk.callbacks.CrossReplicaLoss(), plot])  # doctest: +SKIP
    """

    def __init__(self, path=None, *, show="auto", title: str = "Loss per replica"):
        super().__init__()
        if show not in ("auto", True, False):
            raise ValueError(
                f"show must be 'auto', True or False. Received: show={show!r}. Use "
                "show='auto' to display only in Jupyter."
            )
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ValueError(
                f"path must be a file path or None. Received: path={path!r}. Pass e.g. "
                "path='loss.png', or None (default) for no file."
            )
        self.path = pathlib.Path(path) if path is not None else None
        self.show = _in_notebook() if show == "auto" else show
        self.title = title
        self.history: dict[str, list[float]] = {}
        self._display = None
        self._file_writer = LatestOnly(self._write_plot_of, name="strategykit-loss-plot")

    def on_train_begin(self, logs=None):
        self.history, self._display = {}, None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        for key in plotted_keys(logs):
            self.history.setdefault(key, []).append(float(logs[key]))
        if not self.history:
            return
        to_file = self.path is not None and is_chief(self.model.distribute_strategy)
        if self.show:  # drawn here: the notebook's output belongs to this thread
            png = self.render()
            self._update_display(png)
            if to_file:
                self._write(png)
        elif to_file:
            self._file_writer.submit({key: list(values) for key, values in self.history.items()})

    def on_train_end(self, logs=None):
        self._file_writer.wait()  # the file holds the last epoch's plot; raises its error

    def render(self, history: dict[str, list[float]] | None = None) -> bytes:
        """The plot of `history` (default: `self.history`) as PNG bytes."""
        history = self.history if history is None else history
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        figure = Figure(figsize=(7, 4), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for key, values in sorted(history.items()):
            epochs = range(1, len(values) + 1)
            style = "--" if key.startswith("val_") else "-"
            if _REPLICA_KEY.match(key):
                axes.plot(epochs, values, style, marker=".", linewidth=1, alpha=0.6, label=key)
            else:
                color = None if not key.removeprefix("val_").startswith("loss") else (
                    "gray" if key.startswith("val_") else "black")
                axes.plot(epochs, values, style, marker=".", linewidth=2.5, color=color,
                          label=key)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("epoch")
        axes.set_ylabel("loss")
        axes.set_title(self.title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", ncol=2)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()

    def _write_plot_of(self, history: dict[str, list[float]]) -> None:
        self._write(self.render(history))

    def _write(self, png: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(png)

    def _update_display(self, png: bytes) -> None:
        from IPython.display import Image, display

        if self._display is None:
            self._display = display(Image(data=png), display_id=True)
        else:
            self._display.update(Image(data=png))


def plotted_keys(logs: dict) -> list[str]:
    """Per-replica keys and each loss's mean when present, otherwise Keras's
    `loss`/`val_loss`."""
    keys = [key for key in logs if _REPLICA_KEY.match(key)]
    names = {_REPLICA_KEY.match(key).group(2) for key in keys} or {"loss"}
    for name in sorted(names):
        for prefix in ("", "val_"):
            if f"{prefix}{name}/mean" in logs:
                keys.append(f"{prefix}{name}/mean")
            elif f"{prefix}{name}" in logs:
                keys.append(f"{prefix}{name}")
    return keys


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
