"""strategykit's own tf.data functions are traced without AutoGraph; a user's `augment`
is converted as tf.data converts it (`strategykit.data.own_functions`).

AutoGraph logs each call it converts (`tf.autograph.set_verbosity`): the functions named
there are the ones it rewrote, or would have (TensorFlow's own are listed and left as
they are).
"""

import contextlib
import io
import re

import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit.data import batching, own_functions, pipeline, position, sharding
from strategykit.made.remade_data import remaker_of

OWN_MODULES = (batching, own_functions, pipeline, position, sharding)


@contextlib.contextmanager
def converted_calls():
    """The list of names of the functions AutoGraph converts in the block."""
    names, log = [], io.StringIO()
    tf.autograph.set_verbosity(1, alsologtostdout=True)
    try:
        with contextlib.redirect_stdout(log):
            yield names
    finally:
        tf.autograph.set_verbosity(0)
    names += re.findall(r"^Converted call: <(?:function|bound method) ([\w.<>]+)",
                        log.getvalue(), flags=re.MULTILINE)


def _strategykits(names) -> list[str]:
    """The names, of `names`, of functions strategykit's data modules define (`f` of
    `f.<locals>.g` included)."""
    own = {name for module in OWN_MODULES for name in vars(module)}
    return [name for name in names if name.split(".")[0] in own]


@pytest.mark.parametrize("pad_remainder", [True, False], ids=["pad", "split"])
def test_shard_converts_none_of_its_own_functions(make_strategy, pad_remainder):
    strategy = make_strategy(4)
    x = np.arange(10, dtype="float32")[:, None]
    with converted_calls() as names:
        ds = sk.shard((x, x[:, 0]), strategy, global_batch_size=8, shuffle=True, seed=3,
                      pad_remainder=pad_remainder)
        steps = sk.replica_batches(ds, strategy)
    assert _strategykits(names) == []
    values = sorted(v for step in steps for replica in step for v in replica)
    assert values == [[float(i)] for i in range(10)]  # each once (padded copies left out)


@pytest.mark.parametrize("seed", [None, 7])
def test_a_users_augment_is_converted_its_python_if_on_a_tensor_included(make_strategy,
                                                                         seed):
    strategy = make_strategy(2)
    x = np.array([[-1.0], [2.0], [-3.0], [4.0]], "float32")

    def augment(example, _seed):
        features, label = example
        if tf.reduce_sum(features) < 0:  # AutoGraph's: a tf.cond
            features = -features
        return features, label

    with converted_calls() as names:
        ds = sk.shard((x, x[:, 0]), strategy, global_batch_size=4, seed=seed, augment=augment)
        step, = sk.replica_batches(ds, strategy)
    assert any(name.endswith("augment") for name in names)
    assert [v for replica in step for v in replica] == [[1.0], [2.0], [3.0], [4.0]]


def test_a_preprocessor_is_converted_in_the_one_batch_function_not_in_each_pass(
        make_strategy):
    # keras-hub's preprocessor (upstream/keras_hub_pipelines.py) runs in the function that
    # weighs and pads each batch, mapped once after the epochs' passes and converted by
    # AutoGraph as tf.data converts a mapped function: a tokenizer's large function is
    # made ready once per iterator, not in every pass (a 4-replica iterator of a GPT-2
    # tokenizer's pipeline started in 2.2 s of CPU instead of 6.1). Mapped inside each
    # pass before, it ran unconverted there: its Python `if` on a tensor failed.
    strategy = make_strategy(4)
    x = np.arange(1.0, 11.0, dtype="float32")[:, None]

    def tokenize(features, labels=None, sample_weight=None):  # as preprocess_samples
        if tf.reduce_sum(features) > 0:  # AutoGraph's: a tf.cond
            features = -features
        return features, features[:, 0], sample_weight

    with converted_calls() as names:
        ds = remaker_of(sk.shard(x, strategy, global_batch_size=8))(preprocess=tokenize)
        steps = sk.replica_batches(ds, strategy)
    assert any(name.endswith("tokenize") for name in names)
    own = _strategykits(names)
    assert own and all(name.split(".")[0] in vars(batching) for name in own), own
    assert "make_pipeline.<locals>.one_pass" not in names  # the passes: as written
    values = sorted(v for step in steps for replica in step for v in replica)
    assert values == sorted([[-float(i)] for i in range(1, 11)])  # each once
