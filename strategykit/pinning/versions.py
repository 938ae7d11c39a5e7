"""The TensorFlow and Keras releases strategykit supports and was checked on.

Plain data, importing nothing: `noxfile.py` (the matrix), `pyproject.toml`'s bounds,
the Compatibility page and the run-time check of the fixes (`strategykit.pinning.fix`)
all say the same, and tests/pinning/test_versions.py holds them to it.
"""

CHECKED_ON = (
    ("2.18.1", "3.8.0"),
    ("2.20.0", "3.11.3"),
    ("2.21.0", "3.13.2"),
    ("2.21.0", "3.15.1"),
)
"""The (TensorFlow, Keras) pairs the whole matrix ran on: oldest first, newest last."""

KERAS_FINGERPRINTED = ("3.8.0", "3.9.0", "3.9.1", "3.9.2", "3.10.0", "3.11.0", "3.11.1",
                       "3.11.2", "3.11.3", "3.12.0", "3.12.1", "3.12.2", "3.12.3", "3.12.4",
                       "3.13.0", "3.13.1", "3.13.2", "3.14.0", "3.14.1", "3.15.0", "3.15.1")
"""Every Keras release of the range: the private code the fixes rely on was
fingerprinted on each, and where it differs from a pair of CHECKED_ON, read and pinned."""

TENSORFLOW_RANGE = (">=2.18", "<2.22")
KERAS_RANGE = (">=3.8", "<=3.15.1")

KERAS_HUB_RANGE = (">=0.18", "<=0.32.0")
"""keras-hub, an optional extra (`pip install "strategykit[keras-hub]"`): the releases
whose `Task` models train on `sk.shard` data (`strategykit.upstream.keras_hub_pipelines`).
pip picks one that the Keras installed allows: 0.25.1 for Keras 3.8 to 3.12, 0.29.1 for
3.13 and 3.14, 0.32.0 for 3.15."""

KERAS_HUB_FINGERPRINTED = (
    "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.19.2", "0.19.3", "0.20.0", "0.21.0", "0.21.1",
    "0.22.0", "0.22.1", "0.22.2", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.1",
    "0.28.0", "0.29.0", "0.29.1", "0.30.0", "0.31.0", "0.31.1", "0.32.0")
"""Every keras-hub release of its range, fingerprinted as the Keras releases are."""


def describe_checked_on() -> str:
    """The checked pairs in words.

    Example:
        >>> describe_checked_on().split("; ")[0]
        'TensorFlow 2.18.1 + Keras 3.8.0'
    """
    return "; ".join(f"TensorFlow {tf} + Keras {keras}" for tf, keras in CHECKED_ON)
