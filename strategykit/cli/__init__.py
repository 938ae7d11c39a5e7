"""The `strategykit` command: `info`, `demo`, `check` and `launch`.

Holds the argument parsing, the demo (the main job on packaged data), the equivalence
self-test, the machine report and the epoch timer the demo and benchmarks share. Builds
on every other part; nothing imports it but `strategykit_console`.
"""
