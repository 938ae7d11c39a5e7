"""keras-hub's image classifiers on several replicas of sk.shard data equal one device.

Two backbone families with batch norm (ResNet, DenseNet; tiny configs of one stack each,
3 and 4 batch norm layers, no download), each with its own preprocessor (an image
converter that rescales), converted to synchronized batch norm with
`sk.convert_sync_batchnorm`, trained whole (DenseNet) and through keras.io's fine-tuning
flow (ResNet): the backbone frozen (`backbone.trainable = False`), the head trained, the
backbone unfrozen, recompiled in the scope and fine-tuned (validation data of keras-hub
models: tests/hub/test_text_classifier.py), on 2 replicas. 21 examples (a full batch,
then a final batch of 5, padded: 3 and 2 real examples on the replicas), float64, against one
device on the same global batches, run eagerly (the same computation untraced): every
weight (moving statistics included) and every number `fit()` reports. And a ResNet of
two stacks (6 batch norm layers) trained whole from the start, built inside the scope
(converted in place) or outside it (copied into it, of its own class, its preprocessor
kept), on 4 replicas, against keras-hub's own model on one device, each replica's images
of another brightness. (Each replica traces the steps once: 2 replicas where 4 would show
nothing more halve these tests' CPU.)
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk

from conftest import assert_same_as_one_device, cpu_devices, reference_runs_eagerly

keras_hub = pytest.importorskip("keras_hub")

TRAIN, GLOBAL_BATCH, SIZE, CLASSES = 21, 16, 16, 3


def _resnet():
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64],
        stackwise_num_blocks=[1], stackwise_num_strides=[1],
        block_type="basic_block", use_pre_activation=False, image_shape=(SIZE, SIZE, 3))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(SIZE, SIZE), scale=1 / 255)
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(converter)
    return keras_hub.models.ResNetImageClassifier(backbone, num_classes=CLASSES,
                                                  preprocessor=preprocessor)


def _densenet():
    backbone = keras_hub.models.DenseNetBackbone(
        stackwise_num_repeats=[1], growth_rate=4, image_shape=(SIZE, SIZE, 3))
    converter = keras_hub.layers.DenseNetImageConverter(image_size=(SIZE, SIZE), scale=1 / 255)
    preprocessor = keras_hub.models.DenseNetImageClassifierPreprocessor(converter)
    return keras_hub.models.DenseNetImageClassifier(backbone, num_classes=CLASSES,
                                                    preprocessor=preprocessor)


def _compile(model, learning_rate):
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"], run_eagerly=reference_runs_eagerly())


def _data(examples, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 255, (examples, SIZE, SIZE, 3)), rng.integers(0, CLASSES, examples)


def _fine_tuned(strategy, family, sharded: bool):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = sk.convert_sync_batchnorm(family())
        model.backbone.trainable = family is not _resnet  # keras.io's flow on one family
        _compile(model, 1e-2)
    train = _data(TRAIN, 1)
    if sharded:
        train = {"x": sk.shard(train, strategy, global_batch_size=GLOBAL_BATCH)}
    else:
        train = {"x": train[0], "y": train[1], "batch_size": GLOBAL_BATCH, "shuffle": False}
    head = model.fit(**train, epochs=1, verbose=0).history
    if model.backbone.trainable:
        return model, head
    model.backbone.trainable = True
    with strategy.scope():
        _compile(model, 1e-3)
    tuned = model.fit(**train, epochs=1, verbose=0).history
    return model, {**head, **{f"tuned_{name}": values for name, values in tuned.items()}}


@pytest.mark.slow
@pytest.mark.parametrize("family", [_resnet, _densenet], ids=["resnet", "densenet"])
def test_fine_tuning_an_image_classifier_on_two_replicas_equals_one_device(float64, family):
    one, one_history = _fine_tuned(tf.distribute.get_strategy(), family, sharded=False)
    model, history = _fine_tuned(sk.mirrored(cpu_devices(2)), family, sharded=True)
    assert isinstance(model, type(one))  # still keras-hub's Task, its preprocessor kept
    assert any(isinstance(layer, sk.SyncBatchNormalization)
               for layer in model.backbone._flatten_layers())
    assert_same_as_one_device(model, one, history, one_history)


def _shifted_images(examples, seed):
    """Images whose brightness depends on the replica that gets them (2 per replica in
    a global batch of 8): each replica's own batch norm moments differ from the global."""
    images, labels = _data(examples, seed)
    replica = np.arange(examples) // 2 % 4
    return images / 4 + 60 * replica[:, None, None, None], labels


def _two_stacks():
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 8],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2],
        block_type="basic_block", use_pre_activation=False, image_shape=(SIZE, SIZE, 3))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(SIZE, SIZE), scale=1 / 255)
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(converter)
    return keras_hub.models.ResNetImageClassifier(backbone, num_classes=CLASSES,
                                                  preprocessor=preprocessor)


@pytest.mark.slow
@pytest.mark.parametrize("built", ["in_scope", "outside_scope"])
def test_a_converted_resnet_trains_on_four_replicas_as_the_same_model_on_one_device(
        float64, built):
    """Trained whole for 6 steps (2 epochs of 21 images, batches of 8, each ending on a
    partial batch), SGD: every weight and moving statistic as one device's. A model built
    outside the scope is copied into it: the copy was a plain Functional model without
    its preprocessor (images not rescaled: conv1_bn's moving mean 38 away)."""
    train = _shifted_images(TRAIN, 1)
    keras.utils.set_random_seed(0)
    one = _two_stacks()  # keras-hub's own model, its own batch norm, on one device
    one.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=["accuracy"], run_eagerly=True)
    one_history = one.fit(*train, batch_size=8, shuffle=False, epochs=2, verbose=0).history

    strategy = sk.mirrored(cpu_devices(4))
    keras.utils.set_random_seed(0)
    if built == "outside_scope":
        model = _two_stacks()
    with strategy.scope():
        if built == "in_scope":
            model = _two_stacks()
        model = sk.convert_sync_batchnorm(model)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
    assert type(model) is type(one) and model.preprocessor is not None
    assert sum(isinstance(layer, sk.SyncBatchNormalization)
               for layer in model.backbone.layers) == 6
    history = model.fit(sk.shard(train, strategy, global_batch_size=8), epochs=2,
                        verbose=0).history
    assert_same_as_one_device(model, one, history, one_history)
