"""Exit codes the workers of a job and `strategykit launch` agree on.

`PREEMPTED` (42, TensorFlow's own restart code): the worker received SIGTERM, or a peer
did, during `fit()` with `sk.callbacks.BackupAndRestore`; the chief wrote a backup of
the step every worker stopped after, and running the same command again resumes there.
`strategykit launch` waits for every worker to exit with it and, under `--restarts K`,
restarts the job.
"""

PREEMPTED = 42
