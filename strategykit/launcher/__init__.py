"""`strategykit launch`: worker processes on one machine, started, watched and restarted.

Holds the supervisor (`launch`), each worker's environment (`worker_env`: its
`TF_CONFIG`, ports, GPUs) and output (`worker_output`, `held_output`), what ends a job
(`fault`, `hang_watch`, `process_state`, `orphan_guard`), the private network a job's
ports live in, forked workers (`preload`), and the private folder of everything it writes
on disk (`private_files`). Standard library only: the launcher
imports neither TensorFlow nor Keras (tests/test_layout.py checks it). What the launcher
and its workers agree on, the variables it sets and every exit code, is in
`worker_contract`; the workers report their progress to it through `progress_file`.
"""
