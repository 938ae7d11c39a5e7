"""The distribution tax: 4 simulated replicas against one device, same global batch.

Workload: a 20-layer conv net on 8x8x8 inputs, global batch 64, `fit()` step time.
On a CPU-only machine the 4 replicas are logical CPU devices sharing the same cores, so
this measures what simulated replicas cost, not a speed-up.

    python benchmarks/distribution_tax.py --pairs 5
"""

from __future__ import annotations

import harness
import workloads


def mirrored4() -> float:
    import strategykit as sk

    return workloads.fit_step_seconds_of(sk.mirrored(replicas=4))


def one_device() -> float:
    import tensorflow as tf

    return workloads.fit_step_seconds_of(tf.distribute.get_strategy())


if __name__ == "__main__":
    harness.main(__file__, {"mirrored4": mirrored4, "one_device": one_device},
                 [("mirrored4", "one_device")])
