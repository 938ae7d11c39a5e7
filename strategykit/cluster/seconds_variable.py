"""A number of seconds from an environment variable, 0 turning a watch off.

`STRATEGYKIT_HANG_TIMEOUT` (`stall_watchdog`) and `STRATEGYKIT_START_TIMEOUT`
(`start_watch`) are read alike. Standard library only.

Example:
    >>> read_seconds({"T": "20"}, "T", 300.0, off="to turn it off")
    20.0
"""

from __future__ import annotations

from collections.abc import Mapping


def read_seconds(environ: Mapping[str, str], variable: str, default: float, *,
                 off: str) -> float:
    """`variable` of `environ` in seconds; `default` when unset or empty.

    Args:
        off: what 0 does, ending the message (e.g. `"to turn the watch off"`).

    Raises:
        ValueError: a value that is not a number of seconds >= 0.
    """
    text = environ.get(variable, "")
    if not text.strip():
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(
            f"{variable} must be a number of seconds >= 0. Received: {variable}={text!r}. "
            f"Use e.g. {variable}=600, or 0 {off}.")
    return seconds
