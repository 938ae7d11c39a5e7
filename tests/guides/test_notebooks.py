"""Every notebook in notebooks/ executes from scratch, in a fresh kernel, without error,
and shows none of TensorFlow's C++ log lines.

Each notebook gets an IPython kernel of its own that has run no code: a new process, forked
from one that has imported TensorFlow, Keras and strategykit but started nothing of
TensorFlow's runtime (`forked_kernels`), which saves each kernel about 9 s of CPU. One
test runs a short notebook in a kernel started the ordinary way, where `import
strategykit` itself imports TensorFlow, as in a user's first cell.

Kernels get the environment of a user's: no logging variables, and no
`PYTEST_CURRENT_TEST`, under which ipykernel leaves fd 2 alone (so that TensorFlow's C++
lines would not reach the cells' output at all).
"""

import os
import pathlib

import nbformat
import pytest
from forked_kernels import ForkedKernelManager
from nbclient import NotebookClient

from strategykit.launcher.tensorflow_log import TF_LOG_LINE

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def _user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("TF_CPP", "ABSL", "PYTEST_CURRENT_TEST"))}


def _tensorflow_log_lines(notebook) -> list[str]:
    """TensorFlow's C++ log lines in the outputs (a status's `\t [[{{node ...}}]]` line
    too), and tf.distribute's INFO lines (which TensorFlow prints in notebooks only, one
    each time an all-reduce is traced)."""
    texts = [output.get("text", "") for cell in notebook.cells
             for output in cell.get("outputs", [])]
    return [line for text in texts for line in text.splitlines()
            if TF_LOG_LINE.match(line) or line.startswith(("INFO:tensorflow:", "\t [[{{node"))]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_executes_from_scratch(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", kernel_manager_class=ForkedKernelManager,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=_user_env())  # raises CellExecutionError, naming the cell, on an error
    assert _tensorflow_log_lines(notebook) == []
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    texts = [output.get("text", "") for output in outputs]
    assert not [text for text in texts if "ran out of data" in text or "UserWarning" in text]
    for cell in notebook.cells:
        if "LossPlot(" in cell.source and ".fit(" in cell.source:
            # One figure, updated in place at every epoch end, not one image per epoch.
            images = [output for output in cell.outputs if "image/png" in output.get("data", {})]
            assert len(images) == 1, f"{len(images)} images in {cell.source[:60]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_committed_notebook_shows_no_tensorflow_log_line_nor_quieting_code(path):
    # `import strategykit as sk`, first, is all it takes: no logging settings in the cells.
    notebook = nbformat.read(path, as_version=4)
    assert _tensorflow_log_lines(notebook) == []
    sources = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "TF_CPP_MIN_LOG_LEVEL" not in sources
    assert "get_logger" not in sources
    assert notebook.cells[1].source.startswith("import strategykit as sk\n")


@pytest.mark.slow
def test_a_fresh_kernel_shows_no_tensorflow_log_line_and_keeps_the_logging_settings(tmp_path):
    # A kernel started the ordinary way: `import strategykit` imports TensorFlow here, and
    # the filter must be in place before it. The user's settings are read before strategykit
    # is imported and after it has trained; TensorFlow's logger is at the level TensorFlow
    # itself gives it in an interactive session, INFO (tf_logging.get_logger).
    settings = ("import logging, os\n"
                "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), os.fstat(2).st_ino,\n"
                "      logging.getLogger().level, logging.getLogger().handlers)")
    tiny_fit = ("import keras, numpy as np\n"
                "strategy = sk.mirrored(replicas=2)\n"
                "with strategy.scope():\n"
                "    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
                "    model.compile(optimizer='sgd', loss='mse')\n"
                "model.fit(np.ones((8, 2)), np.ones(8), batch_size=4, epochs=2, verbose=0)\n"
                "import tensorflow as tf\n"
                "print(tf.get_logger().level)")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(settings),
        nbformat.v4.new_code_cell("import strategykit as sk"),
        nbformat.v4.new_code_cell(tiny_fit),
        nbformat.v4.new_code_cell(settings),
    ])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=_user_env())
    assert _tensorflow_log_lines(notebook) == []
    before, after = (cell.outputs[-1]["text"].split(" ", 2) for cell in notebook.cells[::3])
    assert before[0] == after[0] == "None"  # no TF_CPP_MIN_LOG_LEVEL set for the user
    assert before[1] != after[1]  # the filter's pipe on fd 2, in place of ipykernel's
    assert before[2] == after[2]  # the root logger's level and handlers
    fitted = notebook.cells[2].outputs[-1]["text"].splitlines()[-1]
    assert fitted == "20"  # TensorFlow's own choice in a notebook, logging.INFO
