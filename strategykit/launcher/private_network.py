"""A network of the job's own: its workers' ports reachable from no other machine.

TensorFlow serves each worker's port on every network interface (its gRPC server binds
`0.0.0.0`, with no option to change it) and asks no one for credentials, so while a job
of `strategykit launch` runs, anyone who can reach this machine could run operations on
its workers as the user. On Linux the launcher runs the job in a network namespace of
its own instead, which holds nothing but a loopback interface: the workers reach each
other on `localhost` as before, and no other machine, nor any other process on this one,
reaches them. A user namespace created with it lets an unprivileged user do this (as
`unshare --map-current-user --net` does; no root needed); the user and group ids stay
the same inside.

The namespace is held by a small keeper process, this file run as a script (it imports
nothing of strategykit, so no TensorFlow): it creates the namespaces, brings the
loopback interface up, prints `ready`, and lives until its standard input closes (when
the launcher ends, however it ends). Each worker joins the keeper's namespaces before
its command starts (`orphan_guard`). Where the kernel refuses (user namespaces turned
off, a container's seccomp profile, AppArmor's restriction of them), `start` raises
`Unavailable` with the kernel's reason, and the launcher runs the job on the machine's
network, saying so.

Example:
    >>> network = start()  # doctest: +SKIP
    >>> network.pid  # doctest: +SKIP
    40321
    >>> network.close()  # doctest: +SKIP

    Each worker then joins `/proc/40321/ns/user` and `/proc/40321/ns/net` (`join`).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import socket
import struct
import subprocess
import sys

CLONE_NEWUSER = 0x10000000  # from <sched.h>
CLONE_NEWNET = 0x40000000
NAMESPACES = (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET))
"""The namespaces of the job, in the order a worker joins them (user first: it gives the
right to join the other)."""
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1  # from <linux/sockios.h>, <net/if.h>
_START_SECONDS = 10.0  # how long the keeper may take to say whether it is ready


class Unavailable(OSError):
    """The kernel does not give this user a network namespace here; the reason is its
    error message."""


class PrivateNetwork:
    """The job's network namespace, held by its keeper process while this object is open.

    Attributes:
        pid: the keeper's process id: workers join `/proc/<pid>/ns/user` and `.../net`.
    """

    def __init__(self, keeper: subprocess.Popen):
        self._keeper = keeper
        self.pid = keeper.pid

    def close(self) -> None:
        """Ends the keeper; the namespace goes with the last process in it."""
        if self._keeper.stdin:
            self._keeper.stdin.close()
        try:
            self._keeper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._keeper.kill()
            self._keeper.wait()


def start() -> PrivateNetwork:
    """Starts a keeper of a new network namespace with its loopback interface up.

    Returns:
        The open `PrivateNetwork`; close it when the job ends.

    Raises:
        Unavailable: not on Linux, or the kernel refused (its reason in the message).
    """
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces are Linux's; this is {sys.platform}")
    keeper = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([keeper.stdout], [], [], _START_SECONDS)
    answer = keeper.stdout.readline().strip() if ready else "no answer from its keeper"
    keeper.stdout.close()
    if answer != "ready":
        keeper.kill()
        keeper.wait()
        raise Unavailable(answer)
    return PrivateNetwork(keeper)


def join(pid: int) -> None:
    """Moves this process (single-threaded, before its command starts) into the network
    namespace of the keeper `pid`.

    Raises:
        OSError: the keeper is gone, or the kernel refused.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for name, kind in NAMESPACES:
        try:
            descriptor = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY)
        except OSError as error:
            raise OSError(error.errno, f"cannot join the job's private network: its keeper "
                                       f"(process {pid}) is gone") from None
        try:
            if libc.setns(descriptor, kind) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"cannot join the job's {name} namespace: "
                                     f"{os.strerror(error)}")
        finally:
            os.close(descriptor)


def _create() -> None:
    """Puts this process in a new user and network namespace, loopback up."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare: {os.strerror(error)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)
    with socket.socket() as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _keep() -> None:
    """The keeper: creates the namespace, says `ready` (or why not), waits for stdin's end."""
    try:
        _create()
    except OSError as error:
        print(error.strerror or str(error), flush=True)
        return
    print("ready", flush=True)
    sys.stdin.read()  # returns when the launcher closes it or ends


if __name__ == "__main__":
    _keep()
