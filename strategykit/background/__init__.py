"""Work strategykit does on threads of its own, so that no user's call waits for it.

Holds the iterator reaper (`iterator_reaper`: dataset iterators that are done with are
deleted on its thread, as TensorFlow's deletion can block for a minute) and `LatestOnly`
(`latest_only`: the latest of a series of jobs run off the caller's thread, e.g.
`LossPlot`'s drawing, its errors raised at the caller's next call). Standard library
only.
"""
