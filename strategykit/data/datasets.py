"""Image-classification data for the demo: scikit-learn's digits, or a prepared TFDS dataset.

Both give a train and a test split of float32 images in [0, 1] with integer labels, so the
demo trains the same way on either.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ImageData:
    """A train/test split of images (N, H, W, C) in [0, 1] and integer labels.

    Attributes:
        name: where the data comes from.
        x_train, y_train, x_test, y_test: the arrays.
        num_classes: number of label values.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def image_shape(self) -> tuple:
        """The shape of one image, (H, W, C)."""
        return tuple(self.x_train.shape[1:])


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> ImageData:
    """scikit-learn's 8x8 handwritten digits (1,797 images, shipped with the package).

    Args:
        test_fraction: share of the images held out for testing, stratified by label.
            Default 0.25 (1,347 train, 450 test).
        seed: the split's random seed. Default 0: the same split on every machine.

    Returns:
        An `ImageData` of 8x8x1 images in [0, 1] and labels 0-9.

    Example:
        >>> from strategykit.data.datasets import load_digits
        >>> data = load_digits()
        >>> data.x_train.shape, data.x_test.shape
        ((1347, 8, 8, 1), (450, 8, 8, 1))
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
    labels = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    return ImageData("scikit-learn digits", x_train, y_train, x_test, y_test, 10)


def load_tfds_images(name: str, data_dir: str | None = None) -> ImageData:
    """A prepared TFDS image-classification dataset, read into memory.

    The dataset must already be prepared in `data_dir` (nothing is downloaded). It needs
    an `image` and a `label` feature and a `train` split; the `test` split is used for
    testing, or the last 20% of `train` when there is none.

    Args:
        name: the TFDS name, e.g. `"mnist"`.
        data_dir: where it is prepared. Default: TFDS's default (`~/tensorflow_datasets`).

    Returns:
        An `ImageData` with images scaled to [0, 1].

    Raises:
        ValueError: the dataset is unknown, not prepared in `data_dir`, or not an image
            classification dataset.

    Example:
        >>> from strategykit.data.datasets import load_tfds_images
        >>> data = load_tfds_images("mnist", data_dir="/data/tfds")  # doctest: +SKIP
    """
    from strategykit.data.tfds_input import prepared_builder

    builder = prepared_builder(name, data_dir)
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise ValueError(
            f"TFDS dataset {name!r} is not an image classification dataset: it needs "
            f"'image' and 'label' features. Received features: {sorted(features)}. Use a "
            "dataset such as 'mnist' or 'cifar10'."
        )
    x_train, y_train = _read_split(builder, "train")
    if "test" in builder.info.splits:
        x_test, y_test = _read_split(builder, "test")
    else:
        cut = int(len(x_train) * 0.8)
        x_test, y_test = x_train[cut:], y_train[cut:]
        x_train, y_train = x_train[:cut], y_train[:cut]
    return ImageData(name, x_train, y_train, x_test, y_test, features["label"].num_classes)


def _read_split(builder, split: str):
    import tensorflow_datasets as tfds

    data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    images = data["image"].astype("float32") / 255.0
    return images, data["label"].astype("int32")
