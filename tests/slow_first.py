"""The suite's order: each test process starts its share with tests marked `slow`.

pytest-xdist's worksteal scheduler (pyproject.toml's `--dist worksteal`) first gives each
test process the next `len(pending) // processes_left` tests of the collection, in order,
and from then on an idle process takes the second half of the longest queue. In file
order, the slow tests (worker processes, notebook kernels, keras-hub models: 49 of 1373
tests, more than half of the time) end some shares, and a process that starts one
last runs alone for up to a minute while the others have nothing left. Here each share
begins with slow tests instead, a module's together (a module's cached references stay in
one process), so that the end of the run is short tests any idle process can take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Item = TypeVar("Item")


def slow_tests_first(items: Sequence[Item], processes: int, is_slow, module_of) -> list[Item]:
    """`items` reordered so that each of `processes` first shares begins with slow items.

    Slow items are dealt module by module, the modules with most of them first, each to the
    share with the fewest so far; the other items keep their order and fill the shares to
    the sizes worksteal gives them.

    Example:
        >>> slow_tests_first(["a1", "a2", "B1", "B2", "c1", "C2"], 2,
        ...                  is_slow=str.isupper, module_of=lambda item: item[0].lower())
        ['B1', 'B2', 'a1', 'C2', 'a2', 'c1']
    """
    slow_modules: dict[object, list[Item]] = {}
    for item in items:
        if is_slow(item):
            slow_modules.setdefault(module_of(item), []).append(item)
    shares: list[list[Item]] = [[] for _ in range(max(1, processes))]
    for module in sorted(slow_modules.values(), key=len, reverse=True):
        min(shares, key=len).extend(module)
    others = [item for item in items if not is_slow(item)]
    ordered: list[Item] = []
    for k, share in enumerate(shares):
        size = (len(items) - len(ordered)) // (len(shares) - k)  # as worksteal deals
        fill = max(0, size - len(share))
        ordered += share + others[:fill]
        del others[:fill]
    return ordered + others
