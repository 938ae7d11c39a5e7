"""keras-hub's models and sk.shard data: what is refused, and the fix installed on import."""

import numpy as np
import pytest

import strategykit as sk

keras_hub = pytest.importorskip("keras_hub")

LENGTH = 4


@pytest.fixture(scope="module")
def setup():
    strategy = sk.mirrored(replicas=2)
    with strategy.scope():
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=2, intermediate_dim=2,
            max_sequence_length=LENGTH)
        model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)
    x = {"token_ids": np.ones((8, LENGTH), "int32"), "segment_ids": np.zeros((8, LENGTH), "int32"),
         "padding_mask": np.ones((8, LENGTH), "int32")}
    y = np.zeros(8, "int32")
    return model, strategy, x, y


@pytest.mark.parametrize("call, message", [
    (lambda m, data, x, y: m.fit(data, y=y),
     r"fit\(\) of a keras-hub model on sk.shard data takes no y.*Received: y of type "
     r"ndarray. Pass it to sk.shard"),
    (lambda m, data, x, y: m.fit(data, validation_data=(x, y)),
     r"takes validation_data as sk.shard data too.*Received: validation_data of type "
     r"tuple. Pass validation_data=sk.shard\(\(x_val, y_val\)"),
    (lambda m, data, x, y: m.fit(x, y, validation_data=data),
     r"sk.shard validation_data only beside sk.shard training data. Received: x of type "
     r"dict. Pass x=sk.shard"),
    (lambda m, data, x, y: m.fit(data, validation_split=0.2),
     r"takes no validation_split.*Received: validation_split of type float. Split off a "
     r"validation set and pass validation_data=sk.shard"),
    (lambda m, data, x, y: m.evaluate(data, batch_size=4),
     r"evaluate\(\) of a keras-hub model on sk.shard data takes no batch_size"),
    (lambda m, data, x, y: m.predict(data, batch_size=4),
     r"predict\(\) of a keras-hub model on sk.shard data takes no batch_size"),
], ids=["y", "validation_arrays", "validation_only", "validation_split", "evaluate_batch",
        "predict_batch"])
def test_what_keras_hub_would_batch_itself_is_refused_naming_the_fix(setup, call, message):
    model, strategy, x, y = setup
    data = sk.shard((x, y), strategy, global_batch_size=4)
    with pytest.raises(ValueError, match=message):
        call(model, data, x, y)


def test_the_fix_is_installed_when_keras_hub_is_imported_after_strategykit(run_python):
    result = run_python("""
        import sys
        import strategykit as sk
        from strategykit import upstream
        assert "keras_hub" not in sys.modules
        sk.mirrored(replicas=1)
        fixes = upstream.keras_hub_pipelines.FIXES
        print("before:", sorted({fix.state() for fix in fixes}))
        import keras_hub
        print("after:", sorted({fix.state() for fix in fixes}))
    """)
    assert "before: ['on import']\nafter: ['installed']" in result.stdout
