"""Every example of docs/guides/custom-steps.md runs, and does what the page says.

The page's ```python blocks run in order in one namespace, as a reader runs them one
after the other, in a process forked from the fork server (TensorFlow imported, its
runtime not started: `sk.mirrored(replicas=4)` makes its 4 simulated replicas there).
After each block a check of this file's (`CHECKS`, by section) tests what the page
states of it: the numbers a step or a loop reports on 4 replicas are one device's on the
same batches. Every block runs even when one before it failed; the test fails naming
each section whose example or check failed, with its traceback.
"""

import json
import os
import pathlib
import re
import textwrap

import pytest

from workers import run_processes

ROOT = pathlib.Path(__file__).parents[2]
PAGE = ROOT / "docs" / "guides" / "custom-steps.md"
TIMEOUT = 400

# Run the block again on 4 replicas and on one device (the default strategy) from the same
# seed, on the same batches in the same order; the values of `NAMES` must agree. One device
# gets `ONE_DEVICE_DATA`: `sk.shard` of one replica (the final batch of 8 as it is, as Keras
# batches arrays), or explicit weights that make a custom loop's `compute_average_loss(...,
# global_batch_size=64)` the final batch's mean, as `sk.shard`'s weights do on 4 replicas.
_SAME_AS_ONE_DEVICE = """
def _run_block(strategy_, train, seed):
    ns = dict(_namespace)
    ns["strategy"], ns["train"] = strategy_, train
    keras.utils.set_random_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(_source, "<page>", "exec"), ns)
    return ns

x, y, four = _namespace["x"], _namespace["y"], _namespace["strategy"]
replicas = _run_block(four, sk.shard((x, y), four, global_batch_size=64), 7)
one = _run_block(tf.distribute.get_strategy(), ONE_DEVICE_DATA, 7)
assert replicas["strategy"].num_replicas_in_sync == 4
for name in NAMES:
    a, b = eval(name, replicas), eval(name, one)
    np.testing.assert_allclose(np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64"),
                               rtol=1e-4, atol=1e-5, err_msg=f"{name}: 4 replicas vs 1 device")
"""

CHECKS = {
    "A custom `train_step`": _SAME_AS_ONE_DEVICE.replace(
        "NAMES", '["history.history[\'loss\']", "history.history[\'mae\']", '
                 '"model.get_weights()[0]"]').replace(
        "ONE_DEVICE_DATA", "sk.shard((x, y), tf.distribute.get_strategy(), global_batch_size=64)"),
    "Metrics over the real examples only": """
np.testing.assert_allclose(float(real_only.result()), float(one_device), rtol=1e-5)
assert abs(float(every_example.result()) - float(one_device)) > 1e-4  # the copies count
""",
    "A GAN: two optimizers, two losses": """
logs = history.history
for name in ("d_loss", "g_loss"):
    keys = {f"{name}/{suffix}" for suffix in
            ("mean", "min", "max", "std", *(f"replica_{k}" for k in range(4)))}
    assert keys <= set(logs), sorted(set(logs))
    np.testing.assert_allclose(logs[f"{name}/mean"], logs[name], rtol=1e-5)
# binary cross-entropy of barely trained networks: about log 2 = 0.69, not 1/4 of it
assert min(logs["d_loss"]) > 0.4 and min(logs["g_loss"]) > 0.4, logs
""",
    "A training loop from scratch": _SAME_AS_ONE_DEVICE.replace(
        "NAMES", '["losses", "model.get_weights()[0]"]').replace(
        "ONE_DEVICE_DATA", "tf.data.Dataset.from_tensor_slices((x, y, np.r_[np.ones(192), "
                           "np.full(8, 8.0)].astype('float32'))).batch(64)"),
    "Gradient clipping and embeddings": """
keras.utils.set_random_seed(1)
one = text_classifier()
one_device = one.fit(tokens, labels, batch_size=64, epochs=2, shuffle=False, verbose=0)
np.testing.assert_allclose(history.history["loss"], one_device.history["loss"], rtol=1e-5)
for a, b in zip(classifier.get_weights(), one.get_weights(), strict=True):
    np.testing.assert_allclose(a, b, atol=2e-6)
""",
    "Check it": """
assert report.passed, str(report)
""",
}

_RUNNER = """
import contextlib, io, json, sys, traceback
import numpy as np
import tensorflow as tf
import keras
import strategykit as sk

blocks, checks, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
namespace = {"__name__": "__main__"}
results = []
for section, source in blocks:
    result = {"section": section, "error": None, "stdout": ""}
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            exec(compile(source, f"<{section}>", "exec"), namespace)
    except BaseException:
        result["error"] = "the example failed:\\n" + traceback.format_exc()
    result["stdout"] = stdout.getvalue()
    if result["error"] is None and checks.get(section):
        scope = dict(namespace, _namespace=namespace, _source=source, contextlib=contextlib,
                     io=io, np=np, tf=tf, keras=keras, sk=sk)
        try:
            exec(compile(checks[section], f"<check of {section}>", "exec"), scope)
        except BaseException:
            result["error"] = "the example ran; its check failed:\\n" + traceback.format_exc()
    results.append(result)
    with open(out, "w") as file:
        json.dump(results, file)
"""


def page_examples() -> list[tuple[str, str]]:
    """(section heading, code) of every ```python block of the page, in order."""
    section, examples = "top", []
    for match in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", PAGE.read_text(),
                             re.MULTILINE | re.DOTALL):
        if match.group(1):
            section = match.group(1).strip()
        else:
            examples.append((section, match.group(2)))
    return examples


def test_the_page_has_an_example_for_each_section():
    sections = [section for section, _ in page_examples()]
    assert sections[0] == "top"  # the set-up every example starts from
    assert set(CHECKS) <= set(sections), (sorted(CHECKS), sections)
    assert "sk.mirrored(replicas=4)" in page_examples()[0][1]


@pytest.mark.slow
def test_every_example_runs_and_reports_what_one_device_reports(tmp_path):
    blocks, checks = tmp_path / "blocks.json", tmp_path / "checks.json"
    blocks.write_text(json.dumps(page_examples()))
    checks.write_text(json.dumps(CHECKS))
    script, out = tmp_path / "run_page.py", tmp_path / "results.json"
    script.write_text(textwrap.dedent(_RUNNER))
    [run] = run_processes(str(script), [{**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}],
                          args=[str(blocks), str(checks), str(out)], timeout=TIMEOUT,
                          check=False)
    assert out.exists(), (
        f"the page's examples did not run:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    results = json.loads(out.read_text())
    assert len(results) == len(page_examples()), (
        f"stopped after {results[-1]['section']!r}:\n{run.stderr[-4000:]}")
    failed = [r for r in results if r["error"]]
    assert not failed, "\n\n".join(
        f"--- {r['section']}: {r['error'][-3000:]}\nprinted: {r['stdout'][-1000:]}"
        for r in failed)
