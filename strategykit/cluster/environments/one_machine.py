"""No environment: one process on this machine, every local device its replicas."""

from __future__ import annotations

from strategykit.cluster.environments.base import Environment, Task


class OneMachine(Environment):
    """The environment of a process that no cluster started: always detected.

    Example:
        >>> OneMachine({}).workers()
        1
    """

    name = "one machine"

    def detected(self) -> bool:
        return True

    def task(self) -> Task:
        return Task("worker", 0, {})
