"""Several worker processes: the cluster a job runs in, and a launcher for one machine.

Holds the environments a job reads (`TF_CONFIG`, SLURM), which worker this process is
(`sk.is_chief`), chief-only files, and `strategykit launch` with its workers'
environments and output. Builds on TensorFlow's cluster resolvers; the launcher itself
uses only the standard library.
"""
