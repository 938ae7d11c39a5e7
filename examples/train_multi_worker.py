"""Keras `fit()` across worker processes with strategykit: the same script on every worker.

Run it as 2 local worker processes, restarted once if a worker dies:

    strategykit launch --workers 2 --restarts 1 -- python examples/train_multi_worker.py

or on each of several machines with its `TF_CONFIG` (or under SLURM with `srun`). On one
machine without a launcher it trains on the local devices. The chief alone writes
`runs/digits/` (checkpoints, history, loss plot); a worker killed mid-run costs nothing
with `--restarts`: training resumes after the last completed epoch.
"""

import argparse
import os

import keras

import strategykit as sk
from strategykit.cli.demo import build_classifier
from strategykit.data.datasets import load_digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="runs/digits")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)  # the same run every time (the chief's weights start it)
    strategy = sk.from_env()  # TF_CONFIG or SLURM: one worker of the job; else this machine
    if sk.is_chief():
        os.makedirs(args.out, exist_ok=True)  # for CSVLogger, which does not create it
    data = load_digits()
    global_batch_size = 32 * strategy.num_replicas_in_sync
    # One seed on every worker: they shuffle alike and each keeps its replicas' slices.
    train = sk.shard((data.x_train, data.y_train), strategy,
                     global_batch_size=global_batch_size, shuffle=True, seed=0)
    test = sk.shard((data.x_test, data.y_test), strategy,
                    global_batch_size=global_batch_size, pad_remainder=False)

    with strategy.scope():
        model = sk.convert_sync_batchnorm(build_classifier(data.image_shape, data.num_classes))
        model.compile(
            optimizer=keras.optimizers.Adam(sk.scale_learning_rate(
                1e-3, global_batch_size=global_batch_size, base_batch_size=32)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])

    model.fit(train, epochs=args.epochs, shuffle=False, callbacks=[
        sk.callbacks.CrossReplicaLoss(),  # loss/replica_k for every replica of the job
        sk.callbacks.BackupAndRestore(f"{args.out}/backup"),  # resume after a restart
        keras.callbacks.ModelCheckpoint(f"{args.out}/model.keras"),  # chief only
        keras.callbacks.CSVLogger(f"{args.out}/history.csv"),  # chief only
        sk.callbacks.LossPlot(f"{args.out}/loss.png"),  # chief only
    ])
    _, accuracy = model.evaluate(test, verbose=0)
    if sk.is_chief():  # your own output: once, not once per worker
        print(f"test accuracy {accuracy:.2%} on {strategy.num_replicas_in_sync} replicas")


if __name__ == "__main__":
    main()
