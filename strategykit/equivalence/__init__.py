"""`sk.check`: does N-replica training equal 1-device training on the global batch?

Holds the two runs and their comparison, the float64 precision both run in, the weight
by weight differences and the printable `CheckReport`. Builds on `strategykit.strategy`
for the N-replica run.
"""
