"""Where a worker is: the cluster a job runs in and which worker this process is.

Holds the environments a job reads (`environments/`: `TF_CONFIG`, SLURM, Kubernetes,
one module each), which worker this process is (`sk.is_chief`), chief-only files, this
machine's public address, and the callbacks that report a worker's progress to
`strategykit launch`. Builds on TensorFlow's cluster resolvers and `strategykit.launcher`'s
exit codes; the launcher itself is in `strategykit/launcher/`.
"""
