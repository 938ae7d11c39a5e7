"""Keras `fit()` across Ray Train workers with strategykit: the multi-worker script under Ray.

Ray Train's `TensorflowTrainer` (Train V2, Ray 2.56 or later) starts the worker
processes and writes each one's `TF_CONFIG` before the training function runs: workers
only, no chief, so Ray's world rank 0 is worker 0, the chief of `sk.is_chief()` (checked
below). The training function is the multi-worker script of
docs/guides/several-machines.md (`sk.from_env()`, `sk.shard`, synchronized batch norm,
`CrossReplicaLoss`, `BackupAndRestore`); after each epoch it reports Keras's logs to Ray,
with the model as Ray's checkpoint, written by the chief alone.

On this machine (a local Ray of `--workers` CPUs, started and stopped by the script):

    pip install "strategykit[ray]"
    python examples/ray_train.py --workers 2 --epochs 8

On a Ray cluster, with strategykit installed on every node: run it on a node of the
cluster with `--address auto` (or `RAY_ADDRESS` set, as `ray job submit` does), and
`--storage` on a disk every node mounts (NFS, ...). Ray's checkpoints and the backup go
there; every worker reads the backup when the job resumes.

    python examples/ray_train.py --address auto --workers 4 \\
        --storage /mnt/shared/ray-runs --restarts 2

With `--restarts K` Ray starts the workers again after a failure (a worker killed, a
node lost), up to K times, and training resumes after the last completed epoch, with the
weights an uninterrupted run has. The same command run again resumes the same way while
the backup is there (it is deleted when training ends). Neither the workers nor this
script print TensorFlow's C++ log lines unless `--verbose`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

BATCH_PER_REPLICA = 32


def train_loop(config: dict) -> None:
    """The training function every Ray worker runs.

    Args:
        config: `epochs`, `examples` (how many training examples; None: all 1,347),
            `backup_dir` (a folder every worker reads) and `verbose`.
    """
    train(config)  # the model is not returned: Ray would send it to its controller


def train(config: dict):
    """`train_loop`'s training; returns the trained model."""
    import logging

    import keras
    import ray.train

    import strategykit as sk

    if not config.get("verbose"):  # Ray Train sets the root logger to INFO in its workers
        logging.getLogger().setLevel(logging.WARNING)  # Python's default: no TF INFO lines
    keras.utils.set_random_seed(0)  # the same run every time (the chief's weights start it)
    strategy = sk.from_env()  # the TF_CONFIG Ray wrote: one worker of the job
    rank = ray.train.get_context().get_world_rank()
    if sk.is_chief() != (rank == 0):
        raise RuntimeError(f"sk.is_chief() is {sk.is_chief()} on Ray's world rank {rank}: "
                           f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}")
    data = load_data(config["examples"])
    global_batch_size = BATCH_PER_REPLICA * strategy.num_replicas_in_sync
    # One seed on every worker: they shuffle alike and each keeps its replicas' slices.
    train_data = sk.shard((data.x_train, data.y_train), strategy,
                          global_batch_size=global_batch_size, shuffle=True, seed=0)
    test = sk.shard((data.x_test, data.y_test), strategy,
                    global_batch_size=global_batch_size, pad_remainder=False)
    with strategy.scope():
        model = build_model(data, global_batch_size)

    def report_to_ray(epoch, logs):
        """Keras's logs of the epoch to Ray; the model as Ray's checkpoint from the chief.
        Every worker reports (Ray waits for all); the others with no checkpoint."""
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if sk.is_chief():
                model.save(os.path.join(folder, "model.keras"))
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({**logs, "epoch": epoch + 1}, checkpoint=checkpoint,
                             checkpoint_dir_name=f"epoch-{epoch + 1:04d}")

    model.fit(train_data, epochs=config["epochs"], shuffle=False,
              verbose=2 if sk.is_chief() else 0, callbacks=[
                  sk.callbacks.CrossReplicaLoss(),  # loss/replica_k of every replica
                  sk.callbacks.BackupAndRestore(config["backup_dir"]),  # resume after a restart
                  keras.callbacks.LambdaCallback(on_epoch_end=report_to_ray),
              ])
    _, accuracy = model.evaluate(test, verbose=0)
    if sk.is_chief():  # your own output: once, not once per worker
        print(f"test accuracy {accuracy:.2%} on {strategy.num_replicas_in_sync} replicas")
    return model


def load_data(examples: int | None = None):
    """scikit-learn's digits (shipped, nothing downloaded); the first `examples` of the
    training split, or all."""
    import dataclasses

    from strategykit.data.datasets import load_digits

    data = load_digits()
    if examples is None:
        return data
    return dataclasses.replace(data, x_train=data.x_train[:examples],
                               y_train=data.y_train[:examples])


def build_model(data, global_batch_size: int):
    """The demo's conv net, batch norm synchronized, compiled: call it in the strategy's
    scope."""
    import keras

    import strategykit as sk
    from strategykit.cli.demo import build_classifier

    model = sk.convert_sync_batchnorm(build_classifier(data.image_shape, data.num_classes))
    model.compile(
        optimizer=keras.optimizers.Adam(sk.scale_learning_rate(
            1e-3, global_batch_size=global_batch_size, base_batch_size=BATCH_PER_REPLICA)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="Ray workers (default 2)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--examples", type=int, default=None,
                        help="train on the first N training examples (default: all 1,347)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="the Ray cluster's address (default: RAY_ADDRESS, else a "
                             "local Ray of --workers CPUs)")
    parser.add_argument("--storage", default="runs/ray",
                        help="Ray's storage folder, shared by every node (default runs/ray)")
    parser.add_argument("--name", default="digits",
                        help="the run's name: its folder in --storage (default digits)")
    parser.add_argument("--restarts", type=int, default=0,
                        help="times Ray may start the workers again after a failure")
    parser.add_argument("--verbose", action="store_true",
                        help="TensorFlow's and Ray's log lines as they print them")
    return parser.parse_args(argv)


def quiet_worker() -> None:
    """Run by every Ray worker process as it starts, before Ray's TensorFlow backend
    imports TensorFlow: TensorFlow's C++ log lines filtered out of its output, as by the
    `strategykit` command. Ray Train's own actors (its controller, ...) run it too, and
    most never train: TensorFlow is left to whatever imports it."""
    import logging

    from strategykit_console import quiet_tensorflow

    quiet_tensorflow(import_strategykit=False)
    # Ray Train's placement group cleaner asks Ray's state API, served by the dashboard
    # (not in ray[train]), whether the controller lives: without it, a warning a second.
    logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner"
                      ).setLevel(logging.ERROR)


def main(argv: list[str] | None = None, train_loop_per_worker=train_loop):
    """Runs `train_loop_per_worker` on `--workers` Ray workers; returns Ray's result."""
    args = parse_args(argv)
    if not args.verbose:
        from strategykit_console import quiet_tensorflow

        quiet_tensorflow()  # here: this process imports TensorFlow with ray.train.tensorflow
    import logging

    import ray
    import ray.train
    from ray.train.tensorflow import TensorflowTrainer

    storage = os.path.abspath(args.storage)
    runtime_env = {} if args.verbose else {"worker_process_setup_hook": quiet_worker}
    quiet = logging.INFO if args.verbose else logging.WARNING
    if args.address:
        ray.init(args.address, runtime_env=runtime_env, logging_level=quiet)
    else:  # a Ray of our own on this machine: one CPU a worker
        # No node of it can be preempted: no preemption watcher (one process less, and
        # no error line of Ray's about its constructor's arguments).
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        ray.init(address="local", num_cpus=args.workers, include_dashboard=False,
                 runtime_env=runtime_env, logging_level=quiet)
    try:
        trainer = TensorflowTrainer(
            train_loop_per_worker,
            train_loop_config={"epochs": args.epochs, "examples": args.examples,
                               "backup_dir": os.path.join(storage, args.name, "backup"),
                               "verbose": args.verbose},
            scaling_config=ray.train.ScalingConfig(num_workers=args.workers),
            run_config=ray.train.RunConfig(
                name=args.name, storage_path=storage,
                failure_config=ray.train.FailureConfig(max_failures=args.restarts),
                logging_config=ray.train.LoggingConfig(
                    log_level="INFO" if args.verbose else "WARNING")))
        result = trainer.fit()
    finally:
        ray.shutdown()
    print(f"Ray's checkpoint of the last epoch: {result.checkpoint.path}/model.keras")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
