"""The `strategykit` command: `info`, `demo`, `check` and `launch`.

Holds the argument parsing, the demo (the main job on packaged data), the equivalence
self-test on the demo's model, the machine report, the epoch timer the demo and
benchmarks share, and `python -m strategykit` made the command (`run_as_module`). Builds
on every other part; nothing imports it but `strategykit_console`, and the package's
`__init__` imports `run_as_module` (standard library only).
"""
