"""Where a worker is: the cluster a job runs in and which worker this process is.

Holds the environments a job reads (`environments/`: `TF_CONFIG`, SLURM, Kubernetes,
one module each, behind one interface that also counts the workers and finds this
worker's index), which worker this process is (`roles`, `sk.is_chief`), chief-only
files, this machine's public address, the `strategy` argument checked
(`strategy_argument`), and the callback that reports a worker's progress
(`progress_reporter`: to `strategykit launch`, or to the worker's own `stall_watchdog`).
Before and while a multi-worker strategy starts: this worker's port checked free
(`own_port`), and the peers that never connect named (`start_watch`, with its timeout
read as `seconds_variable` reads every watch's).
Builds on TensorFlow's cluster resolvers and on what `strategykit.launcher` and its
workers agree on (`strategykit.launcher.worker_contract`); the launcher itself is in
`strategykit/launcher/`.
"""
