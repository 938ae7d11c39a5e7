"""What `strategykit launch` and its workers agree on: environment variables and exit codes.

The launcher sets the `*_VARIABLE`s for every worker it starts (`worker_env`, `launch`);
strategykit reads them inside the worker (`strategykit.cluster`). A worker tells why it
ended by its exit code, which the launcher (or a scheduler, without the launcher) acts
on; the launcher ends with the failed worker's code, one of its own below, or 128 + N
for a worker killed by signal N, as a shell reports it. Each value has one name, here,
and every module uses it from here. Standard library only, and importing nothing, so
the launcher's `orphan_guard`, run as a script, reads this file as a sibling.

Example:
    >>> PREEMPTED, HUNG
    (42, 124)
"""

# --- the environment of each worker ------------------------------------------------

WORKER_VARIABLE = "STRATEGYKIT_WORKER"
"""Set by the launcher: the worker's index k, 0 for the chief (also `TF_CONFIG`'s task
index). Scripts may read it; `strategykit info` takes it as the sign that the launcher
wrote `TF_CONFIG`."""

RESTART_VARIABLE = "STRATEGYKIT_RESTART"
"""Set by the launcher: the job's attempt, 0 at first, 1 after its first restart, ...;
for a script that does something once per attempt (e.g. a log file of its own)."""

PROGRESS_FILE_VARIABLE = "STRATEGYKIT_PROGRESS_FILE"
"""Set by the launcher: the file a worker reports its training progress to
(`progress_file`), for the launcher's hang watch (`hang_watch`); `sk.from_env()` starts
the reporting when it is set (`strategykit.cluster.progress_reporter`)."""

HANG_TIMEOUT_VARIABLE = "STRATEGYKIT_HANG_TIMEOUT"
"""Set by the user of a job started without the launcher (SLURM, Kubernetes): seconds
without a completed step, inside `fit()`, `evaluate()` or `predict()`, after which a
worker exits with `HUNG` (default 300, 0 off; `strategykit.cluster.stall_watchdog`).
Under the launcher its `--hang-timeout` watches the whole job instead."""

# --- exit codes ----------------------------------------------------------------------

PREEMPTED = 42
"""A worker that backed up and stopped on SIGTERM (to it or to a peer) during `fit()`
with `sk.callbacks.BackupAndRestore`, and the launcher when its workers did so: running
the same command again resumes at the step after the backup; under `--restarts K` the
launcher restarts the job. 42 is TensorFlow's own code for it
(`tf.distribute.experimental.PreemptionCheckpointHandler`)."""

HUNG = 124
"""A job stopped as hung: the launcher's, when no worker made progress for
`--hang-timeout` seconds (`hang_watch`), or a stopped worker is to blame (`fault`); and a
worker's own, when it made none for `STRATEGYKIT_HANG_TIMEOUT` seconds (`stall_watchdog`).
124 is what `timeout(1)` exits with when it stops a command."""

NO_PRIVATE_NETWORK = 126
"""A worker that could not join the job's private network (`private_network`), from
`orphan_guard` before the command starts; 126 as a shell's "cannot execute": the
command never ran."""

CANNOT_START = 127
"""A worker whose command could not be started (not found, not executable), from
`orphan_guard`; 127 as a shell's "command not found"."""

LAUNCHER_GONE = 143
"""A worker that ended because its launcher died before it started (`orphan_guard`,
`preload_server`); 143 = 128 + SIGTERM, as if the launcher had stopped it."""
