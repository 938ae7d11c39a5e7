"""strategykit's own tf.data functions are traced as written, without AutoGraph.

tf.data hands every function it maps to AutoGraph, which rewrites the function's Python
source (and that of each function it calls) so that `if` and `for` on tensors become
graph control flow. strategykit's input functions need none of it: their control flow
on tensors is `tf.cond` and `tf.where` already, their Python `if`s decide on Python
values while tracing. The rewrite cost a process 0.7 s of CPU the first time it made an
`sk.shard` dataset (of 0.86 s in all; the second dataset took 0.1 s), in every fresh
worker process and notebook kernel. A pass that runs a user's function (an `augment`,
keras-hub's preprocessor) is converted as tf.data converts a user's, every function in
it: AutoGraph's switch holds for whatever a traced function calls and maps.
"""

from __future__ import annotations

import tensorflow as tf


def traced_as_written(function):
    """`function`, and whatever it calls or maps while traced, traced without AutoGraph.

    Example:
        >>> import tensorflow as tf
        >>> halves = tf.data.Dataset.range(4).map(traced_as_written(lambda i: i // 2))
        >>> [int(i) for i in halves]
        [0, 0, 1, 1]
    """
    return tf.autograph.experimental.do_not_convert(function)


def runs_users_functions(**functions) -> bool:
    """Whether a pipeline runs any of the user's `functions` (None: not given), which
    AutoGraph must then convert as tf.data would.

    Example:
        >>> runs_users_functions(augment=None, preprocess=None)
        False
        >>> runs_users_functions(augment=lambda example, seed: example, preprocess=None)
        True
    """
    return any(function is not None for function in functions.values())
