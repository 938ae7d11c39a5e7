import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from strategykit.cli.demo import run_demo
from strategykit.data.datasets import load_digits, load_tfds_images


def test_digits_are_a_fixed_stratified_split_of_all_1797_images():
    data = load_digits()
    assert data.x_train.shape == (1347, 8, 8, 1) and data.x_test.shape == (450, 8, 8, 1)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    assert data.num_classes == 10 and data.image_shape == (8, 8, 1)
    # Stratified: every class in both splits, in about the same share.
    assert set(np.unique(data.y_test)) == set(range(10))
    assert np.abs(np.bincount(data.y_test) / 450 - np.bincount(data.y_train) / 1347).max() < 0.01
    # The same split on every call (and machine).
    again = load_digits()
    np.testing.assert_array_equal(again.x_test, data.x_test)
    # No image is in both splits.
    train_rows = {row.tobytes() for row in data.x_train.reshape(1347, -1)}
    assert not any(row.tobytes() in train_rows for row in data.x_test.reshape(450, -1))


class TinyDigitImages(tfds.core.GeneratorBasedBuilder):
    """50 8x8 grey images of 10 classes, a train split only (the test split is cut off)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1)),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(50):
            yield i, {"image": np.full((8, 8, 1), 5 * i, np.uint8), "label": i % 10}


class TinyTable(tfds.core.GeneratorBasedBuilder):
    """Not images: 10 rows of numbers."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"value": tf.int64}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(10):
            yield i, {"value": i}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    tfds.disable_progress_bar()
    directory = str(tmp_path_factory.mktemp("tfds"))
    for builder in (TinyDigitImages, TinyTable):
        builder(data_dir=directory).download_and_prepare()
    return directory


def test_a_prepared_tfds_image_dataset_is_read_scaled_and_split(tfds_dir):
    data = load_tfds_images("tiny_digit_images", tfds_dir)
    assert data.x_train.shape == (40, 8, 8, 1) and data.x_test.shape == (10, 8, 8, 1)
    assert data.num_classes == 10 and data.x_train.dtype == np.float32
    # Every image is one grey level 5 i / 255 with label i % 10: read back, all 50 once.
    levels = np.concatenate([data.x_train, data.x_test])[:, 0, 0, 0] * 255 / 5
    ids = np.rint(levels).astype(int)
    assert sorted(ids) == list(range(50))
    labels = np.concatenate([data.y_train, data.y_test])
    np.testing.assert_array_equal(labels, ids % 10)


def test_a_tfds_dataset_without_images_is_a_clear_error(tfds_dir):
    with pytest.raises(ValueError, match=r"'tiny_table' is not an image classification "
                       r"dataset: it needs 'image' and 'label' features\. Received features: "
                       r"\['value'\]"):
        load_tfds_images("tiny_table", tfds_dir)


def test_the_demo_trains_on_a_prepared_tfds_dataset(tfds_dir, tmp_path):
    result = run_demo(replicas=2, epochs=1, dataset="tiny_digit_images", data_dir=tfds_dir,
                      out=tmp_path, verbose=0)
    assert result.data == "tiny_digit_images"
    assert result.strategy["replicas"] == 2
    assert 0.0 <= result.test_accuracy <= 1.0
