"""The upstream fixes module: each fix named, idempotent, removable, and pinned to the
upstream code it relies on (so a Keras or TensorFlow upgrade fails here, not for users).

What each fix does is tested by the tests of its feature (tests/upstream/test_accumulation.py
for keras-team/keras#20582).
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategykit as sk
from strategykit import upstream
from strategykit.pinning import pinned_access


@pytest.mark.parametrize("fix", upstream.FIXES, ids=lambda fix: f"{fix.issue}:{fix.attribute}")
def test_upstream_code_is_what_the_fix_was_checked_on(fix):
    changed = fix.unknown_code()
    assert not changed, (
        f"Upstream code that the fix for {fix.issue} relies on differs from the versions "
        f"it was checked on ({upstream.CHECKED_ON}) on TensorFlow {tf.__version__} + Keras "
        f"{keras.__version__}: {sorted(changed)}. Check whether {fix.issue} is fixed "
        "upstream (then the fix is not needed there), or re-check the fix against the new "
        "code and its tests, then add these fingerprints to relies_on in "
        f"strategykit/upstream/: {changed}."
    )


@pytest.mark.parametrize("fix", upstream.FIXES, ids=lambda fix: f"{fix.issue}:{fix.attribute}")
def test_each_fix_names_its_issue_and_what_it_affects(fix):
    assert re.fullmatch(r"[\w.-]+/[\w.-]+(#\d+|@\d+\.\d+\.\d+| \(unreported\))", fix.issue)
    assert fix.affects and fix.relies_on
    for pinned in fix.relies_on.values():
        for value in (pinned,) if isinstance(pinned, str) else pinned:
            assert re.fullmatch(r"[0-9a-f]{16}", value)


def test_fixes_are_idempotent_and_removable():
    upstream.install()
    # Reading an optional package's class imports it, which installs every fix again.
    fixes = [fix for fix in upstream.FIXES if fix.imported()]
    try:
        upstream.uninstall()
        upstream.uninstall()
        for fix in fixes:
            assert not fix.installed()
            assert vars(fix.owner_class()).get(fix.attribute) is not fix.replacement
        upstream.install()
        upstream.install()
        for fix in fixes:
            assert fix.installed() or fix.not_needed()
            assert (vars(fix.owner_class()).get(fix.attribute) is fix.replacement
                    or fix.not_needed())
        upstream.uninstall()
    finally:
        upstream.install()


def test_strategies_install_the_fixes(make_strategy):
    upstream.uninstall()
    make_strategy(1)
    assert all(fix.installed() or fix.not_needed() if fix.imported() else
               fix.state() == "on import" for fix in upstream.FIXES)
    assert any(fix.installed() for fix in upstream.FIXES)



def test_tensorflow_counts_per_replica_batches_as_steps_and_state_steps_corrects_it(
        make_strategy):
    # 8 examples in per-replica batches of 2 on 2 replicas: 2 steps, counted 4 upstream.
    # When TensorFlow counts steps itself this fails: then sk.shard needs state_steps only
    # for the pipelines whose passes tf.data cannot count.
    strategy = make_strategy(2)
    ds = strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.range(8).batch(2))
    assert int(ds.cardinality) == 4 and len(list(ds)) == 2
    upstream.state_steps(ds, 2)
    assert int(ds.cardinality) == 2


def test_tensorflow_cannot_count_a_pass_started_at_the_training_position(make_strategy):
    strategy = make_strategy(2)
    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(0).flat_map(lambda _: tf.data.Dataset.range(8).batch(4)))
    assert int(ds.cardinality) == tf.data.UNKNOWN_CARDINALITY
    upstream.state_steps(ds, 2)
    assert int(ds.cardinality) == 2 == len(list(ds))


@pytest.mark.parametrize("access", upstream.PINNED, ids=lambda access: access.affects)
def test_private_code_read_or_called_is_what_it_was_checked_on(access):
    changed = access.unknown_code()
    assert not changed, (
        f"TensorFlow {tf.__version__} + Keras {keras.__version__} changed private code that "
        f"strategykit reads, sets or calls for {access.affects!r}: {sorted(changed)}. Check "
        "its module in strategykit/upstream/ against the new code, then add these "
        f"fingerprints to its PinnedAccess: {changed}.")
    assert re.fullmatch(r"[\w.-]+/[\w.-]+(#\d+|@\d+\.\d+\.\d+| \(unreported\))",
                        access.issue)


def _unknown(access, monkeypatch):
    """`access` as on a TensorFlow whose code differs from every pinned fingerprint."""
    name = next(iter(access.relies_on))
    monkeypatch.setitem(pinned_access._FOUND, access, {name: "0123456789abcdef"})
    monkeypatch.setattr(upstream, "_warned", [False])  # this test's warning, not others'


def test_on_unknown_code_a_refusing_access_raises_naming_what_and_the_fix(monkeypatch):
    from strategykit.upstream import coordination
    _unknown(coordination.COORDINATION, monkeypatch)
    with pytest.raises(upstream.UnknownUpstreamCode,
                       match=r"cannot make BackupAndRestore's agreement .* relies on private "
                             r"upstream code .*set_config_key_value.* pip install"):
        coordination.set_key("strategykit-test", "1")
    assert coordination.COORDINATION.state() == "refusing"


def test_on_unknown_code_strategies_build_as_tensorflow_builds_them(monkeypatch):
    from strategykit.upstream import strategy_internals
    _unknown(strategy_internals.COLLECTIVE_KEYS, monkeypatch)
    _unknown(strategy_internals.ALL_REDUCE, monkeypatch)
    strategy = strategy_internals.mirrored_strategy(["/cpu:0", "/cpu:1"], None)
    assert strategy.extended._collective_key_base == 0  # TensorFlow's own
    assert strategy_internals.all_reduce_in_use(strategy) == (None, None)
    assert sk.describe(strategy)["all_reduce"] == "unknown"
    assert {entry["state"] for entry in upstream.status() if entry["replaces"] is None} == {
        "checked", "upstream's own"}


def test_on_unknown_code_shard_says_so_once_and_refuses_where_steps_would_differ(
        monkeypatch):
    from strategykit.upstream import step_count
    _unknown(step_count.STEPS, monkeypatch)
    with pytest.warns(upstream.UpstreamVersionWarning, match="these refuse with an error "
                      "when used: the steps of an epoch of sk.shard data"):
        strategy = sk.mirrored(replicas=2)
    with pytest.raises(upstream.UnknownUpstreamCode, match="the steps of an epoch"):
        sk.shard(np.arange(8.0), strategy, global_batch_size=4)
