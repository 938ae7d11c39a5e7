"""convert_sync_batchnorm: every BatchNormalization synchronized, every weight kept exactly."""

import contextlib
import functools
import inspect

import keras
import numpy as np
import pytest

import strategykit as sk


def randomize(model, seed=0):
    """Gives every weight (moving statistics too) a distinct random value, variances > 0."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(0.5, 1.5, size=w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def batch_norms(model):
    """Every batch norm layer of the model, nested models included, by name."""
    found = {}
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found.update(batch_norms(layer))
        elif isinstance(layer, keras.layers.BatchNormalization):
            found[layer.name] = layer
    return found


def assert_same_weights(a, b):
    assert [w.path for w in a.weights] == [w.path for w in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=x.path)


def nested_model():
    inner_sequential = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, name="d1"),
         keras.layers.BatchNormalization(name="bn_seq")], name="inner_seq")
    inner_inputs = keras.Input((5,), name="inner_x")
    inner_functional = keras.Model(
        inner_inputs, keras.layers.BatchNormalization(name="bn_fun")(
            keras.layers.Dense(5, name="d2")(inner_inputs)), name="inner_fun")
    inputs = keras.Input((6,), name="x")
    x = inner_functional(inner_sequential(inputs))
    outputs = keras.layers.BatchNormalization(name="bn_top")(x)
    model = keras.Model(inputs, outputs, name="outer")
    model.get_layer("bn_top").trainable = False
    inner_sequential.get_layer("d1").trainable = False
    return randomize(model)


def test_sequential_model():
    model = randomize(keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="dense"),
         keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-4, name="bn")], name="seq"))
    weights = model.get_weights()
    layer = model.get_layer("bn")
    converted = sk.convert_sync_batchnorm(model)
    assert converted is model  # its variables belong to the current (default) strategy
    assert model.get_layer("bn") is layer and type(layer) is sk.SyncBatchNormalization
    assert (layer.momentum, layer.epsilon, layer.name) == (0.9, 1e-4, "bn")
    for value, weight in zip(weights, model.weights):
        np.testing.assert_array_equal(np.asarray(weight), value)


def convert_a_copy(model, strategy):
    """The converted copy of a model built outside `strategy`'s scope, converted in it."""
    nested = any(isinstance(layer, keras.Model) for layer in model.layers)
    warns = pytest.warns(UserWarning, match="converted copy") if nested else (
        contextlib.nullcontext())
    with strategy.scope(), warns:
        return sk.convert_sync_batchnorm(model)


@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "copy"])
def test_nested_functional_and_sequential_models_keep_names_and_trainable_flags(
        in_place, make_strategy):
    model, reference = nested_model(), nested_model()
    converted = (sk.convert_sync_batchnorm(model) if in_place
                 else convert_a_copy(model, make_strategy(1)))
    assert (converted is model) is in_place
    model = reference
    assert {name: type(layer) for name, layer in batch_norms(converted).items()} == {
        "bn_seq": sk.SyncBatchNormalization, "bn_fun": sk.SyncBatchNormalization,
        "bn_top": sk.SyncBatchNormalization}
    assert [layer.name for layer in converted.layers] == [layer.name for layer in model.layers]
    assert converted.get_layer("bn_top").trainable is False
    assert converted.get_layer("inner_seq").get_layer("d1").trainable is False
    assert converted.get_layer("inner_fun").trainable is True
    assert [w.path for w in converted.trainable_weights] == [
        w.path for w in model.trainable_weights]
    assert_same_weights(model, converted)
    x = np.random.default_rng(1).normal(size=(5, 6)).astype("float32")
    np.testing.assert_array_equal(converted.predict(x, verbose=0), model.predict(x, verbose=0))


def test_the_way_back_gives_plain_batch_normalization():
    model = nested_model()
    synced = sk.convert_sync_batchnorm(model)
    plain = sk.convert_sync_batchnorm(synced, synchronized=False)
    assert all(type(layer) is keras.layers.BatchNormalization
               for layer in batch_norms(plain).values())
    assert not any(layer.synchronized for layer in batch_norms(plain).values())
    assert_same_weights(model, plain)
    assert plain.get_layer("bn_top").trainable is False


def test_compiled_model_stays_compiled():
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    converted = sk.convert_sync_batchnorm(model)
    assert converted.compiled
    assert converted.get_compile_config() == model.get_compile_config()


def test_inside_a_strategy_scope_the_variables_belong_to_it(make_strategy):
    strategy = make_strategy(2)
    model = nested_model()
    converted = convert_a_copy(model, strategy)
    assert all(strategy.extended.variable_created_in_scope(w.value) for w in converted.weights)
    assert_same_weights(model, converted)
    x = np.random.default_rng(2).normal(size=(8, 6)).astype("float32")
    np.testing.assert_allclose(converted.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)


@functools.cache
def application_and_converted(application):
    """A Keras application (random weights, 32 x 32 inputs) and its conversion, built once:
    neither test using them changes either."""
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, application)(
        weights=None, input_shape=(32, 32, 3), classes=10)
    return model, sk.convert_sync_batchnorm(model)


@pytest.mark.parametrize("application", ["ResNet50", "MobileNetV2", "EfficientNetB0"])
def test_keras_applications_predict_identically(application):
    model, converted = application_and_converted(application)
    original_norms, converted_norms = batch_norms(model), batch_norms(converted)
    assert len(original_norms) > 40 and converted_norms.keys() == original_norms.keys()
    assert all(type(layer) is sk.SyncBatchNormalization for layer in converted_norms.values())
    assert_same_weights(model, converted)
    x = np.random.default_rng(0).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(converted(x, training=False), model(x, training=False))


def test_converted_resnet50_save_and_load_round_trip(tmp_path):
    model, converted = application_and_converted("ResNet50")
    path = tmp_path / "resnet50.keras"
    converted.save(path)
    loaded = keras.models.load_model(path)
    # saved as Keras's own BatchNormalization(synchronized=True): loads anywhere
    assert all(type(layer) is keras.layers.BatchNormalization and layer.synchronized
               for layer in batch_norms(loaded).values())
    assert all(type(layer) is sk.SyncBatchNormalization
               for layer in batch_norms(converted).values())
    assert_same_weights(converted, loaded)
    x = np.random.default_rng(0).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(loaded(x, training=False), model(x, training=False))


class Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)
        self.norm = keras.layers.BatchNormalization()

    def call(self, x):
        return self.norm(self.dense(x))


def test_a_subclassed_model_is_converted_in_place():
    model = Subclassed(name="mine")
    model(np.ones((2, 4), "float32"))
    assert sk.convert_sync_batchnorm(model) is model
    assert type(model.norm) is sk.SyncBatchNormalization


def test_a_subclassed_model_built_outside_the_scope_gets_a_clear_error(make_strategy):
    model = Subclassed(name="mine")
    model(np.ones((2, 4), "float32"))
    with make_strategy(2).scope():
        with pytest.raises(ValueError, match=r"subclassed model 'mine' \(Subclassed\): its "
                                             r"variables were created outside the current "
                                             r"strategy's scope \(MirroredStrategy\).*inside "
                                             r"strategy.scope\(\) to convert it in place"):
            sk.convert_sync_batchnorm(model)
    assert type(model.norm) is keras.layers.BatchNormalization  # left as it was


def test_a_subclassed_model_nested_in_a_functional_one(make_strategy):
    inner = Subclassed(name="block")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, inner(inputs))
    with make_strategy(2).scope():
        with pytest.raises(ValueError, match=r"nested subclassed model 'block'.*batch norm "
                                             r"layers \['batch_normalization.*'\] that cannot "
                                             r"be converted in a copy.*Functional API"):
            sk.convert_sync_batchnorm(model)
    sk.convert_sync_batchnorm(model)  # in place, where its variables belong
    assert type(inner.norm) is sk.SyncBatchNormalization


class Block(keras.layers.Layer):
    """A custom layer holding its own batch norm, as keras.io's residual blocks do."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3, name="dense")
        self.norm = keras.layers.BatchNormalization(momentum=0.0, name="norm")

    def call(self, x, training=None):
        return self.norm(self.dense(x), training=training)


def hidden_norms_model():
    """Batch norms where model.layers does not list them: in a custom layer, and wrapped
    in TimeDistributed."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2, 4))
    frames = keras.layers.TimeDistributed(
        keras.layers.BatchNormalization(momentum=0.0, name="frame_norm"), name="frames")
    x = Block(name="block")(frames(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(x)))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def hidden_norms(model):
    return [model.get_layer("frames").layer, model.get_layer("block").norm]


@pytest.mark.parametrize("where", ["in place", "copy"])
def test_batch_norms_in_custom_layers_and_wrappers_are_converted(where, make_strategy):
    strategy = make_strategy(2)
    original = hidden_norms_model()
    initial = original.get_weights()
    with strategy.scope():
        model = sk.convert_sync_batchnorm(
            hidden_norms_model() if where == "in place" else original)
    model.set_weights(initial)
    assert all(type(norm) is sk.SyncBatchNormalization for norm in hidden_norms(model))
    if where == "copy":
        assert model is not original
        assert all(type(norm) is keras.layers.BatchNormalization
                   for norm in hidden_norms(original))

    # Replica 0's examples are near 0.1, replica 1's near 5: each replica's own moments
    # would have a variance near 0, the global batch's is about 6.
    x = np.concatenate([np.full((2, 2, 4), 0.1), np.full((2, 2, 4), 5.0)]).astype("float32")
    x += np.linspace(0.0, 0.2, 16, dtype="float32").reshape(4, 2, 2)[..., :1]
    y = np.zeros((4, 1), "float32")
    model.fit(sk.shard((x, y), strategy, global_batch_size=4), epochs=1, verbose=0)
    one = hidden_norms_model()
    one.set_weights(initial)
    one.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    frame_norm = hidden_norms(model)[0]
    np.testing.assert_allclose(frame_norm.moving_variance.numpy(),
                               x.reshape(-1, 4).var(axis=0), rtol=1e-3)
    assert frame_norm.moving_variance.numpy().min() > 5.0
    for found, expected in zip(hidden_norms(model), hidden_norms(one)):
        np.testing.assert_allclose(found.moving_variance.numpy(),
                                   expected.moving_variance.numpy(), rtol=1e-4)
        np.testing.assert_allclose(found.moving_mean.numpy(),
                                   expected.moving_mean.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(
    "renorm" not in inspect.signature(keras.layers.BatchNormalization).parameters,
    reason=f"Keras {keras.__version__} has no batch renormalization (3.14 and later do)")
def test_rejects_renorm_layers():
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.BatchNormalization(renorm=True, name="rn")])
    with pytest.raises(ValueError, match=r"'rn' uses batch renormalization.*renorm=True"):
        sk.convert_sync_batchnorm(model)


def test_rejects_what_is_not_a_model():
    with pytest.raises(ValueError,
                       match=r"expects a Keras model. Received: model=a BatchNormalization"):
        sk.convert_sync_batchnorm(keras.layers.BatchNormalization())


def test_rejects_a_non_boolean_synchronized():
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    with pytest.raises(ValueError, match=r"synchronized must be True or False.*'yes'"):
        sk.convert_sync_batchnorm(model, synchronized="yes")


def test_sequential_built_by_calling_it(make_strategy):
    model = keras.Sequential([keras.layers.Dense(3), keras.layers.BatchNormalization()])
    model(np.ones((2, 4), "float32"))  # built without an Input
    randomize(model)
    converted = convert_a_copy(model, make_strategy(1))
    assert type(converted.layers[-1]) is sk.SyncBatchNormalization
    assert_same_weights(model, converted)


def fine_tuning_model():
    """keras.io's transfer-learning model in small: a frozen Functional base with batch
    norm, called with training=False, under a Dense head. Returns (base, model)."""
    keras.utils.set_random_seed(0)
    base_inputs = keras.Input((3,))
    base = keras.Model(base_inputs, keras.layers.BatchNormalization(name="base_bn")(
        keras.layers.Dense(4, name="base_dense")(base_inputs)), name="base")
    base.trainable = False
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1, name="head")(base(inputs, training=False))
    return base, keras.Model(inputs, outputs, name="classifier")


def test_fine_tuning_after_conversion_trains_the_base_like_one_device(make_strategy):
    # The guide's idiom: freeze the base, convert, train; then base.trainable = True,
    # recompile and fine-tune. Converted by a copy, base_model.trainable = True changed
    # the old model only: the converted one trained its head alone.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    reference_base, reference = fine_tuning_model()
    reference_base.trainable = True
    reference.compile(keras.optimizers.SGD(0.1), "mse")
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)

    strategy = make_strategy(4)
    with strategy.scope():
        base, model = fine_tuning_model()
        model = sk.convert_sync_batchnorm(model)
        model.compile(keras.optimizers.SGD(0.1), "mse")
    assert [w.path for w in model.trainable_weights] == ["head/kernel", "head/bias"]
    frozen = base.get_weights()
    base.trainable = True
    with strategy.scope():
        model.compile(keras.optimizers.SGD(0.1), "mse")
    assert [w.path for w in model.trainable_weights] == [
        w.path for w in reference.trainable_weights]
    assert len(model.trainable_weights) == 6
    model.fit(sk.shard((x, y), strategy, global_batch_size=8), epochs=1, verbose=0)
    trained = dict(zip([w.path for w in base.weights], base.get_weights()))
    for path, before in zip(trained, frozen):  # the outer training=True reaches the base
        if path != "base_dense/bias":  # (Keras 3): its bias is normalized away
            assert np.abs(trained[path] - before).max() > 1e-3, path
    for weight, expected in zip(model.weights, reference.weights):
        np.testing.assert_allclose(np.asarray(weight), np.asarray(expected), atol=1e-5,
                                   err_msg=weight.path)


def test_a_copy_names_the_nested_models_whose_references_are_stale(make_strategy):
    base, model = fine_tuning_model()  # outside the scope: it cannot convert in place
    with make_strategy(2).scope(), pytest.warns(
            UserWarning, match=r"converted copy of model 'classifier'.*outside the current "
                               r"strategy's scope.*nested models \['base'\].*base_model."
                               r"trainable = True.*converted.get_layer\('base'\).*inside "
                               r"strategy.scope\(\) to convert it in place"):
        converted = sk.convert_sync_batchnorm(model)
    assert converted is not model
    assert type(converted.get_layer("base").get_layer("base_bn")) is sk.SyncBatchNormalization
    assert type(base.get_layer("base_bn")) is keras.layers.BatchNormalization  # unchanged
