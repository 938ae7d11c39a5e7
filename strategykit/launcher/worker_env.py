"""What each worker of `strategykit launch` gets: its `TF_CONFIG`, ports and GPUs.

No TensorFlow here: GPUs are found with `nvidia-smi -L`, ports by binding port 0.

Example:
    >>> gpu_assignment(2, None, ["0", "1", "2", "3"])
    ['0,1', '2,3']
    >>> env = worker_env(1, attempt=0, ports=[40001, 40002], gpus=None, base={})
    >>> json.loads(env["TF_CONFIG"])["cluster"], env["STRATEGYKIT_WORKER"]
    ({'worker': ['localhost:40001', 'localhost:40002']}, '1')
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence

from strategykit.launcher.worker_contract import RESTART_VARIABLE, WORKER_VARIABLE


def worker_env(worker: int, attempt: int, ports: Sequence[int], gpus: str | None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of worker `worker` of a job on this machine.

    Args:
        worker: the worker's index k; worker 0 is the chief.
        attempt: 0 for the job's first start, 1 after its first restart, ...
        ports: the loopback port of every worker.
        gpus: the worker's `CUDA_VISIBLE_DEVICES`, or None to leave it as in `base`.
        base: the environment to extend; default None: `os.environ`.

    Returns:
        `base` plus `TF_CONFIG` (`{"cluster": {"worker": ["localhost:p0", ...]}, "task":
        {"type": "worker", "index": k}}`), `STRATEGYKIT_WORKER=k`,
        `STRATEGYKIT_RESTART=attempt`, `CUDA_VISIBLE_DEVICES` unless `gpus` is None, and
        `PYTHONUNBUFFERED=1` unless `base` sets it (so a worker's prints show at once).
    """
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    task = {"type": "worker", "index": worker}
    env = {**(os.environ if base is None else base),
           "TF_CONFIG": json.dumps({"cluster": cluster, "task": task}),
           WORKER_VARIABLE: str(worker), RESTART_VARIABLE: str(attempt)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def gpu_assignment(workers: int, gpus_per_worker: int | None,
                   gpus: Sequence[str]) -> list[str | None]:
    """The `CUDA_VISIBLE_DEVICES` of each worker: worker k gets GPUs `k*G .. k*G+G-1`.

    Args:
        workers: the number of workers.
        gpus_per_worker: G, the GPUs for each worker; 0 hides every GPU (the workers run
            on the CPU). Default None: `len(gpus) // workers` when there are at least as
            many GPUs as workers; with fewer (or none) every worker keeps what it sees.
        gpus: the GPU ids found, e.g. `["0", "1", "2", "3"]` (see `find_gpus`).

    Returns:
        One entry per worker, None where `CUDA_VISIBLE_DEVICES` stays as it is:
        `gpu_assignment(2, 1, ["0", "1", "2"])` is `["0", "1"]`.

    Raises:
        ValueError: `gpus_per_worker` is negative or asks for more GPUs than `gpus`.
    """
    if gpus_per_worker is None:
        if len(gpus) < workers:
            return [None] * workers
        gpus_per_worker = len(gpus) // workers
    received = f"Received: gpus_per_worker={gpus_per_worker}, workers={workers}."
    if gpus_per_worker < 0:
        raise ValueError(f"gpus_per_worker cannot be negative. {received} Use "
                         "--gpus-per-worker 0 to run the workers on the CPU, or leave it out.")
    most = len(gpus) // workers
    if gpus_per_worker > most:
        if not gpus:
            fix = "Leave --gpus-per-worker out: with no GPU every worker runs on the CPU."
        else:
            fewer = f"--gpus-per-worker from 1 to {most}" if most else \
                f"at most {count(len(gpus), 'worker')} with 1 GPU each"
            fix = f"Use {fewer}, or --gpus-per-worker 0 to run the workers on the CPU."
        raise ValueError(
            f"{count(workers, 'worker')} x {count(gpus_per_worker, 'GPU')} need "
            f"{gpus_per_worker * workers} GPUs, but {count(len(gpus), 'GPU')} found "
            f"(CUDA_VISIBLE_DEVICES, else nvidia-smi -L). {received} {fix}")
    g = gpus_per_worker
    return [",".join(gpus[k * g:(k + 1) * g]) for k in range(workers)]


def find_gpus() -> list[str]:
    """The ids of the GPUs the workers can share, found without TensorFlow.

    Returns:
        Those listed in `CUDA_VISIBLE_DEVICES` when it is set (up to the first empty or
        `-1` entry, as CUDA reads it), else `"0"`, `"1"`, ... one per GPU `nvidia-smi -L`
        lists; none when there is no `nvidia-smi`.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [gpu.strip() for gpu in visible.split(",")]
        return ids[: next((i for i, gpu in enumerate(ids) if gpu in ("", "-1")), len(ids))]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in listing.splitlines()))]


def free_ports(number: int) -> list[int]:
    """`number` distinct TCP ports of the loopback interface, free when picked."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(number)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def count(number: int, noun: str) -> str:
    """`count(1, "GPU")` is "1 GPU", `count(2, "GPU")` "2 GPUs"."""
    return f"{number} {noun}{'s' * (number != 1)}"
