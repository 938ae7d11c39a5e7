import math
import re

import keras
import numpy as np
import pytest

import strategykit as sk


def re_escape(value):
    return re.escape(repr(value))


@pytest.mark.parametrize("base_lr, global_batch, base_batch, rule, expected", [
    (0.1, 1024, 256, "linear", 0.4),             # Goyal et al.: 8k images at 3.2 = 0.1 x 32
    (0.1, 8192, 256, "linear", 3.2),
    (0.1, 1024, 256, "sqrt", 0.2),
    (1e-3, 8, 32, "linear", 2.5e-4),             # a smaller batch scales it down
    (1e-3, 8, 32, "sqrt", 5e-4),
    (0.05, 64, 64, "sqrt", 0.05),                # the same batch changes nothing
    (2, 96, 32, "linear", 6.0),                  # ints are numbers too
    (np.float32(0.5), np.int64(512), 256, "linear", 1.0),
])
def test_values(base_lr, global_batch, base_batch, rule, expected):
    lr = sk.scale_learning_rate(base_lr, global_batch, base_batch_size=base_batch, rule=rule)
    assert lr == pytest.approx(expected, rel=1e-12)
    assert type(lr) is float


def test_linear_is_the_default_and_sqrt_is_its_square_root():
    linear = sk.scale_learning_rate(1.0, global_batch_size=768, base_batch_size=256)
    sqrt = sk.scale_learning_rate(1.0, global_batch_size=768, base_batch_size=256, rule="sqrt")
    assert linear == 3.0 and sqrt == pytest.approx(math.sqrt(3.0))


def test_base_batch_size_is_required():
    with pytest.raises(TypeError, match="base_batch_size"):
        sk.scale_learning_rate(0.1, 1024)


@pytest.mark.parametrize("base_lr", [0, -0.1, float("nan"), float("inf"), True, "0.1", None])
def test_base_lr_must_be_a_positive_number(base_lr):
    with pytest.raises(ValueError, match=rf"base_lr must be a positive number\. Received: "
                       rf"base_lr={re_escape(base_lr)}\. Pass the learning rate"):
        sk.scale_learning_rate(base_lr, 1024, base_batch_size=256)


def test_a_schedule_is_refused_with_the_warmup_recipe():
    schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    with pytest.raises(ValueError, match=r"base_lr must be a positive number\. Received: "
                       r"base_lr=<keras.*CosineDecay.*>\. .*scale the rate it warms up "
                       r"to: CosineDecay\(.*warmup_target=sk\.scale_learning_rate"):
        sk.scale_learning_rate(schedule, 1024, base_batch_size=256)


@pytest.mark.parametrize("name", ["global_batch_size", "base_batch_size"])
@pytest.mark.parametrize("value", [0, -8, 256.0, True, "256", None])
def test_batch_sizes_must_be_positive_ints(name, value):
    arguments = {"global_batch_size": 1024, "base_batch_size": 256, name: value}
    with pytest.raises(ValueError, match=rf"{name} must be a positive int\. Received: "
                       rf"{name}={re_escape(value)}\. Pass the number of examples per "
                       r"weight update"):
        sk.scale_learning_rate(0.1, **arguments)


@pytest.mark.parametrize("rule", ["Linear", "square_root", "", True, None])
def test_rule_must_be_linear_or_sqrt(rule):
    with pytest.raises(ValueError, match=rf"rule must be one of \('linear', 'sqrt'\)\. "
                       rf"Received: rule={re_escape(rule)}\. Use \"linear\""):
        sk.scale_learning_rate(0.1, 1024, base_batch_size=256, rule=rule)


def test_the_warmup_recipe_with_keras_cosine_decay():
    # Goyal et al.: start at the base rate, warm up linearly to the scaled one, then decay.
    base, warmup, decay = 0.1, 500, 4_500
    peak = sk.scale_learning_rate(base, global_batch_size=2048, base_batch_size=256)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=base, decay_steps=decay, warmup_target=peak,
        warmup_steps=warmup)
    expected = {
        0: base,                                     # step 0: the base rate
        250: base + (peak - base) / 2,               # halfway through the warmup
        warmup: peak,                                # warmup end: the scaled rate, 0.8
        warmup + decay // 2: peak / 2,               # halfway through the cosine
        warmup + decay: 0.0,
    }
    assert peak == pytest.approx(0.8)
    for step, lr in expected.items():
        assert float(schedule(step)) == pytest.approx(lr, abs=1e-6), step

    optimizer = keras.optimizers.SGD(learning_rate=schedule)  # as the optimizer sees it
    assert float(optimizer.learning_rate) == pytest.approx(base)
    optimizer.iterations.assign(warmup)
    assert float(optimizer.learning_rate) == pytest.approx(peak)
