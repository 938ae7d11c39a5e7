"""Every notebook in notebooks/ executes from scratch, in a fresh kernel, without error.

Each notebook gets an IPython kernel of its own that has run no code: a new process, forked
from one that has imported TensorFlow, Keras and strategykit but started nothing of
TensorFlow's runtime (`forked_kernels`), which saves each kernel about 9 s of CPU.
"""

import pathlib

import nbformat
import pytest
from forked_kernels import ForkedKernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_executes_from_scratch(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", kernel_manager_class=ForkedKernelManager,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    texts = [output.get("text", "") for output in outputs]
    assert not [text for text in texts if "ran out of data" in text or "UserWarning" in text]
    for cell in notebook.cells:
        if "LossPlot(" in cell.source and ".fit(" in cell.source:
            # One figure, updated in place at every epoch end, not one image per epoch.
            images = [output for output in cell.outputs if "image/png" in output.get("data", {})]
            assert len(images) == 1, f"{len(images)} images in {cell.source[:60]!r}"
