"""IPython kernels forked from the suite's fork server: a notebook's kernel without the import.

A kernel started the ordinary way spends about 10 s of CPU here importing TensorFlow, Keras
and strategykit in its first cell and tearing down its interpreter at the end; a forked one
about 1 s (measured: 3 kernels running a cell that makes a strategy, 30 CPU-s; forked, 12,
the fork server's imports included). `ForkedKernelManager` (nbclient's
`kernel_manager_class`) starts each kernel as a worker of this test process's fork server
(`forked_workers`), which has imported them and started nothing of TensorFlow's runtime, so
each kernel starts its own (devices included) when its notebook first asks.

The kernel is a real ipykernel, a process of its own, in a session and process group of
its own, in the working directory and with the environment and connection file that
jupyter_client gives it (`forked_kernel_main`); jupyter_client talks to it over its
connection file as to any kernel. Only its process is handled here instead of by
`subprocess`: interrupts, SIGTERM and SIGKILL go to its process group, and the fork server
(its parent) reaps it and reports its exit code. It ends without the interpreter's teardown
(`teardown=False`), and ends too if the fork server does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid

from forked_workers import forks
from jupyter_client import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner

KERNEL_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_kernel_main.py")


class ForkedKernelProvisioner(LocalProvisioner):
    """LocalProvisioner's ports and connection file; its kernel a worker of the fork server."""

    _files: str | None = None
    _returncode: int | None = None

    @property
    def has_process(self) -> bool:
        return self.pid is not None

    async def launch_kernel(self, cmd: list[str], **kwargs):
        if cmd[1:3] != ["-m", "ipykernel_launcher"]:
            raise ValueError(f"not an ipykernel command: {cmd}")
        self._files = tempfile.mkdtemp(prefix="forked-kernel-")
        self.cwd = kwargs.get("cwd") or os.getcwd()
        self._returncode = None
        self.pid = self.pgid = forks().start(
            KERNEL_MAIN, [self.cwd, *cmd[3:]], kwargs.get("env") or os.environ,
            os.path.join(self._files, "stdout"), os.path.join(self._files, "stderr"),
            teardown=False)
        return self.connection_info

    async def poll(self) -> int | None:
        if self.pid is not None and self._returncode is None:
            self._returncode = forks().wait(self.pid, time.monotonic() + 0.01)
        return self._returncode if self.pid is not None else 0

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        returncode, self.pid = self._returncode, None
        return returncode

    async def send_signal(self, signum: int) -> None:
        if self.pid is not None and self._returncode is None:
            try:
                os.killpg(self.pgid, signum)  # the kernel and whatever it started
            except ProcessLookupError:
                pass  # it has just ended

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if self._files:
            # What the kernel wrote to its own stdout and stderr, outside any cell, goes
            # where an ordinary kernel's would: the test process's.
            for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                with open(os.path.join(self._files, name), errors="replace") as written:
                    stream.write(written.read())
            shutil.rmtree(self._files)
            self._files = None


class ForkedKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernels are forked (`ForkedKernelProvisioner`)."""

    async def _async_pre_start_kernel(self, **kw):
        if self.provisioner is None:
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
            self.provisioner = ForkedKernelProvisioner(
                kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)
