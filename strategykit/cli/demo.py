"""`strategykit demo`: the main job, multi-replica training of a real model on real data.

A small conv net with synchronized batch norm learns scikit-learn's 8x8 digits across N
replicas (every GPU, or 4 simulated replicas on a CPU-only machine; or across worker
processes with `strategykit demo --workers N`), with each replica
fed its own examples by `sk.shard` and every replica's loss reported by
`sk.callbacks.CrossReplicaLoss`. It writes the loss plot (PNG) and the history (CSV).
"""

from __future__ import annotations

import dataclasses
import pathlib

import keras
import tensorflow as tf

from strategykit import callbacks
from strategykit.batchnorm.convert import convert_sync_batchnorm
from strategykit.cli.timing import EpochTimer
from strategykit.data import datasets
from strategykit.data.sharding import shard
from strategykit.strategy.build import mirrored
from strategykit.strategy.describe import describe

GLOBAL_BATCH_SIZE = 64
DEFAULT_EPOCHS = 6


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What a demo run reached.

    Attributes:
        data: the dataset's name.
        strategy: what `sk.describe` says of the strategy used.
        sync_bn: whether batch norm was synchronized.
        xla: whether each replica's step was compiled with XLA (`model.jit_compile`
            after `compile(jit_compile="auto")`: on where there is a GPU).
        epochs: epochs trained.
        test_accuracy: accuracy on the held-out test split.
        seconds_per_epoch: mean wall time of an epoch after the first (which traces).
        first_epoch_seconds: wall time of the first epoch.
        steps_per_epoch: training steps in an epoch.
        global_batch_size: examples per step, over all replicas.
        plot_path, history_path: the files written.
    """

    data: str
    strategy: dict
    sync_bn: bool
    xla: bool
    epochs: int
    test_accuracy: float
    seconds_per_epoch: float
    first_epoch_seconds: float
    steps_per_epoch: int
    global_batch_size: int
    plot_path: pathlib.Path
    history_path: pathlib.Path

    @property
    def steps_per_second(self) -> float:
        """Training steps per second after the first epoch."""
        return self.steps_per_epoch / self.seconds_per_epoch

    @property
    def examples_per_second_per_replica(self) -> float:
        """Training examples each replica processes per second after the first epoch."""
        replicas = self.strategy["replicas"]
        return self.steps_per_second * self.global_batch_size / replicas

    def summary(self) -> str:
        """The table printed at the end of the demo."""
        rows = [
            ("Data", self.data),
            ("Replicas", f"{self.strategy['replicas']}"
                         f"{' (simulated)' if self.strategy['simulated'] else ''}"
                         + (f" on {self.strategy['workers']} worker processes"
                            if self.strategy["workers"] > 1 else "")),
            ("Devices", ", ".join(name.rsplit("/", 1)[-1] for name in self.strategy["devices"])),
            ("All-reduce", self.strategy["all_reduce"]),
            ("Batch norm", "synchronized" if self.sync_bn else "per replica"),
            ("XLA", "each replica's step compiled" if self.xla
             else "off (jit_compile='auto' on a machine without GPU)"),
            ("Epochs", str(self.epochs)),
            ("Test accuracy", f"{self.test_accuracy:.2%}"),
            ("Time per epoch", f"{self.seconds_per_epoch:.2f} s "
                               f"(first epoch {self.first_epoch_seconds:.1f} s, tracing)"),
            ("Throughput", f"{self.steps_per_second:.1f} steps/s of {self.global_batch_size} "
                           f"examples, {self.examples_per_second_per_replica:,.0f} "
                           "examples/s per replica"),
            ("Loss plot", str(self.plot_path)),
            ("History", str(self.history_path)),
        ]
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def build_classifier(image_shape: tuple, num_classes: int) -> keras.Model:
    """A small conv net with batch norm: two 3x3 conv blocks, pooling, one more, a head.

    BN momentum is 0.9 so that the moving statistics settle within the few hundred
    steps a small dataset gives (with Keras's default 0.99 they lag and test accuracy
    collapses).

    Example:
        >>> from strategykit.cli.demo import build_classifier
        >>> build_classifier((8, 8, 1), 10).output_shape
        (None, 10)
    """
    inputs = keras.Input(image_shape)
    x = inputs
    for block, filters in enumerate((32, 32, 64)):
        if block == 2:
            x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)
        x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name="digits_convnet")


def run_demo(
    *,
    replicas: int | None = None,
    epochs: int = DEFAULT_EPOCHS,
    sync_bn: bool = True,
    out: str | pathlib.Path = "strategykit-demo",
    dataset: str | None = None,
    data_dir: str | None = None,
    verbose: int | str = "auto",
    seed: int = 0,
    strategy: tf.distribute.Strategy | None = None,
) -> DemoResult:
    """Trains the demo model across replicas and returns what it reached.

    Args:
        replicas: number of replicas. Default: every GPU, or 4 simulated replicas on a
            machine without GPUs.
        epochs: epochs to train. Default 6 (99% test accuracy on the digits).
        sync_bn: convert the model's batch norm to `sk.SyncBatchNormalization`.
            Default True.
        out: folder for `loss.png` and `history.csv`; created. Default
            `strategykit-demo`.
        dataset: a prepared TFDS image-classification dataset to use instead of
            scikit-learn's digits. Default None (digits).
        data_dir: where that TFDS dataset is prepared.
        verbose: Keras `fit()` verbosity. Default `"auto"` (progress bar).
        seed: seed of weights and shuffling. Default 0.
        strategy: the strategy to train under instead of `sk.mirrored(replicas)`, e.g.
            `sk.from_env()` on each worker of `strategykit demo --workers N`. The files
            are then written by the chief only.

    Returns:
        A `DemoResult`; `.summary()` is the printed table.

    Example:
        >>> from strategykit.cli.demo import run_demo
        >>> result = run_demo(epochs=1, out="/tmp/demo")  # doctest: +SKIP
        >>> print(result.summary())  # doctest: +SKIP
    """
    strategy = strategy or mirrored(replicas=replicas or _default_replicas())
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = datasets.load_tfds_images(dataset, data_dir) if dataset else datasets.load_digits()
    keras.utils.set_random_seed(seed)
    # The final 3 of 1,347 examples are dropped (3 others every epoch): a step of 3 real
    # examples would normalize batch norm over those 3 alone, a step that sets training back.
    # Data smaller than one global batch is padded instead.
    train = shard((data.x_train, data.y_train), strategy, global_batch_size=GLOBAL_BATCH_SIZE,
                  shuffle=True, seed=seed,
                  drop_remainder=len(data.x_train) >= GLOBAL_BATCH_SIZE)
    # Split, not padded: the test accuracy counts every test example exactly once.
    test = shard((data.x_test, data.y_test), strategy, global_batch_size=GLOBAL_BATCH_SIZE,
                 pad_remainder=False)
    with strategy.scope():
        model = build_classifier(data.image_shape, data.num_classes)
        if sync_bn:
            model = convert_sync_batchnorm(model)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    timer = EpochTimer()
    plot_path, history_path = out / "loss.png", out / "history.csv"
    model.fit(
        train,
        epochs=epochs,
        shuffle=False,  # sk.shard shuffles, anew each epoch; Keras cannot shuffle a dataset
        verbose=verbose,
        callbacks=[
            callbacks.CrossReplicaLoss(),
            callbacks.LossPlot(path=plot_path),
            keras.callbacks.CSVLogger(str(history_path)),
            timer,
        ],
    )
    _, accuracy = model.evaluate(test, verbose=0)
    later = timer.steady_seconds
    return DemoResult(
        data=data.name,
        strategy=describe(strategy),
        sync_bn=sync_bn,
        xla=model.jit_compile is True,
        epochs=epochs,
        test_accuracy=float(accuracy),
        seconds_per_epoch=sum(later) / len(later),
        first_epoch_seconds=timer.seconds[0],
        steps_per_epoch=timer.steps[-1],
        global_batch_size=GLOBAL_BATCH_SIZE,
        plot_path=plot_path,
        history_path=history_path,
    )


def _default_replicas() -> int:
    from strategykit.strategy.devices import physical_devices

    return len(physical_devices("GPU")) or 4
