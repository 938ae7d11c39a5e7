"""`sk.check`: does N-replica training equal 1-device training on the global batch?

Holds the two runs and their comparison: the data fed to both as `fit()` is fed, the
float64 precision both run in (quietly), the random layers switched off on both sides,
the weight by weight differences, every reported number compared and the printable
`CheckReport`. Builds on `strategykit.strategy` and `strategykit.data` for the N-replica run.
"""
