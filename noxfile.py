"""The compatibility matrix: the tests on each supported TensorFlow + Keras pair.

    nox                                            # the older pairs (.ci/run)
    nox -s "matrix(2.18.1-3.8.0)"                  # one pair
    nox -s "matrix(2.18.1-3.8.0)" -- tests/upstream -x   # other pytest arguments
    nox -s matrix                                  # every pair, the newest too

The newest pair is the README's own test command (`pip install -e ".[dev]" && python
-m pytest`, whole suite); the older pairs run the tests of everything that depends on
Keras's and TensorFlow's private code or numbers: upstream/, pinning/, equivalence/, data/,
batchnorm/, callbacks/, strategy/, cli/ (the demo, the quiet console) and hub/
(with the newest keras-hub release that the pair's Keras allows). Each pair's
virtualenv is kept in .nox/ and reused.
"""

import ast
import pathlib

import nox

nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"

_VERSIONS = pathlib.Path(__file__).parent / "strategykit" / "pinning" / "versions.py"


def _checked_on():
    """CHECKED_ON of strategykit/pinning/versions.py, read without importing TensorFlow."""
    for node in ast.parse(_VERSIONS.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "CHECKED_ON":
            return ast.literal_eval(node.value)
    raise RuntimeError(f"no CHECKED_ON in {_VERSIONS}")


PAIRS = _checked_on()
OLDER_PAIRS = PAIRS[:-1]
nox.options.sessions = [f"matrix({tf}-{keras})" for tf, keras in OLDER_PAIRS]
SUBSET = ["tests/upstream", "tests/pinning", "tests/equivalence", "tests/data",
          "tests/batchnorm", "tests/callbacks", "tests/strategy", "tests/cli",
          "tests/hub", "tests/test_layout.py"]


@nox.session(name="matrix")
@nox.parametrize("tensorflow,keras", PAIRS, ids=[f"{tf}-{keras}" for tf, keras in PAIRS])
def matrix(session, tensorflow, keras):
    """The suite on one TensorFlow + Keras pair (a subset on the older pairs)."""
    session.install("-e", ".[test]", f"tensorflow=={tensorflow}", f"keras=={keras}")
    newest = (tensorflow, keras) == PAIRS[-1]
    session.run("python", "-m", "pytest", *(session.posargs or ([] if newest else SUBSET)))
