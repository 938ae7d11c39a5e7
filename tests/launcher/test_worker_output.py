"""The launcher's output stays linear in its workers' output, however long a line gets.

Before, the chief's update in progress was drawn whole again with every chunk read from
its pipe: 8 MB of one `\\r` line made 524 MB of output. Fed here through the real path,
a pipe read by `forward`'s thread, in the writes a worker makes.
"""

import io
import os
import threading

import pytest

from strategykit.launcher.worker_output import MAX_LINE_CHARS, LineForwarder, Terminal, forward

MEGABYTES = 8


def through_a_pipe(data: bytes, worker: int = 0, write_size: int = 4096) -> str:
    """What the launcher's stdout shows of `data` written to worker `worker`'s stdout."""
    out = io.StringIO()
    read_end, write_end = os.pipe()
    reader = forward(read_end, LineForwarder(Terminal(out, io.StringIO()), worker, "stdout"))

    def write() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as pipe:
            for start in range(0, len(data), write_size):
                pipe.write(data[start:start + write_size])

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(120)
    reader.join(120)
    assert not reader.is_alive(), "the output thread did not finish"
    return out.getvalue()


@pytest.mark.parametrize("worker", [0, 1])
def test_one_long_line_after_a_return_comes_out_once_in_pieces(worker):
    data = b"\r" + b"x" * (MEGABYTES << 20)
    out = through_a_pipe(data, worker)
    assert len(out) <= 1.01 * len(data)
    pieces = [line for line in out.replace("\r", "\n").split("\n") if line]
    assert all(len(line) <= len("[worker 0] ") + MAX_LINE_CHARS for line in pieces)
    assert "".join(line.removeprefix(f"[worker {worker}] ") for line in pieces) == \
        "x" * (MEGABYTES << 20)  # nothing lost, nothing twice


def test_many_progress_updates_show_at_most_each_once():
    updates = b"".join(f"\r{step}/999999 \u2501\u2501 - loss: 0.5".encode()
                       for step in range(1, 10 ** 6))
    data = updates[:MEGABYTES << 20] + b"\rdone\n"
    out = through_a_pipe(data, write_size=65536)
    assert len(out.encode()) <= 2 * len(data)
    assert out.endswith("\r[worker 0] done\n")


def test_an_update_written_a_character_at_a_time_is_written_once():
    data = b"\r" + b"." * 20000 + b"\n"
    out = through_a_pipe(data, write_size=1)
    assert out == "\r[worker 0] " + "." * 20000 + "\n"
