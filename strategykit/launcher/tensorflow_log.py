"""TensorFlow's C++ log lines: recognized (`TF_LOG_LINE`) and filtered out of stderr.

TensorFlow prints C++ log lines from the moment it is imported (`cudart_stub.cc ...
Could not find cuda drivers`, `cpu_feature_guard.cc ...`), some before its logging is
set up, where `TF_CPP_MIN_LOG_LEVEL` does not reach them, and more at the end of
training (`local_rendezvous.cc ... recv item cancelled`). They are written to file
descriptor 2, below Python, so the filter here sits on that descriptor: a pipe, and a
thread that copies it line by line to where fd 2 went before, without those lines.
Every other line passes unchanged, a line not yet ended (a prompt) at once.

Two places install it, neither when the user set `TF_CPP_MIN_LOG_LEVEL` themselves:
- the `strategykit` command (`quiet_tensorflow`, from `strategykit_console`), which also
  sets `TF_CPP_MIN_LOG_LEVEL=2`, unless `--verbose`;
- `import strategykit` in a Jupyter (IPython) kernel (`filter_notebook_output`), where
  ipykernel (6 and later) captures fd 2 and would show those lines under the cell. The
  lines go to the kernel's own stderr instead (the terminal that started Jupyter), and
  no logging setting is changed. There a filter on the `tensorflow` logger also drops
  tf.distribute's INFO lines, which TensorFlow prints in notebooks only, one each time
  a step with an all-reduce is traced (`tf.get_logger().setLevel("DEBUG")` shows them
  again). In a plain script nothing is installed: a pipe thread on fd 2 could lose the
  last lines of a crash.

Standard library only: the command installs it before anything imports TensorFlow.

Example:
    >>> bool(TF_LOG_LINE.match("I0000 00:00:1795452128.332057    2921 port.cc:153] oneDNN"))
    True
    >>> bool(TF_LOG_LINE.match("[worker 1] W1123 16:39:56.123456  99 cuda_dnn.cc:8] x"))
    True
    >>> bool(TF_LOG_LINE.match("Epoch 1/2"))
    False
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import stat
import sys
import threading

TF_LOG_LINE = re.compile(
    r"^(?:\[worker \d+\] )?"
    r"(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .*, in other operations, rebuild TensorFlow)"
)
"""A line of TensorFlow's C++ log (or absl's notice before its logging starts), also as
`strategykit launch` forwards a worker's (`[worker k] I0000 ...`). Both formats:
absl's (`I0000 00:00:1795452128.332057    2921 port.cc:153] ...`) and TensorFlow's own,
which TensorFlow 2.18 and 2.20 print some lines in
(`2026-11-27 08:16:03.752152: E external/.../cuda_fft.cc:477] ...`); and the second line
of `cpu_feature_guard.cc`'s message (`To enable the following instructions: AVX2 ...`),
its only message of two lines."""

_installed = False


def quiet_tensorflow() -> None:
    """Sets `TF_CPP_MIN_LOG_LEVEL=2` and filters TensorFlow's log lines out of stderr.

    For the `strategykit` command only; call it before TensorFlow is imported. The
    filter lasts until the interpreter exits.
    """
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    filter_stderr()


def filter_notebook_output() -> bool:
    """In a Jupyter kernel that shows fd 2 under the cells, keeps TensorFlow's lines out.

    Does nothing (and returns False) outside an IPython kernel, when ipykernel does not
    capture fd 2, when the user set `TF_CPP_MIN_LOG_LEVEL`, or when the filter is in
    place already. TensorFlow's lines go to the kernel's own stderr instead.

    Returns:
        Whether the filter is in place now.
    """
    if _installed:
        return True
    kernel_stderr = getattr(sys.stderr, "_original_stdstream_copy", None)  # ipykernel's
    if ("ipykernel" not in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ
            or not isinstance(kernel_stderr, int) or not stat.S_ISFIFO(os.fstat(2).st_mode)):
        return False
    filter_stderr(dropped_to=kernel_stderr)
    logging.getLogger("tensorflow").addFilter(_DistributeChatter())
    return True


class _DistributeChatter(logging.Filter):
    """Drops tf.distribute's INFO records ("Collective all_reduce tensors: ...", "Reduce
    to ... then broadcast to ...": one each time a step with an all-reduce is traced),
    which TensorFlow shows in notebooks only (its logger is at INFO where Python is
    interactive), unless the user asked for DEBUG. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        chatter = (record.levelno == logging.INFO
                   and "/tensorflow/python/distribute/" in record.pathname.replace("\\", "/"))
        return not chatter or logging.getLogger("tensorflow").getEffectiveLevel() < logging.INFO


def filter_stderr(dropped_to: int | None = None) -> None:
    """Filters TensorFlow's log lines out of file descriptor 2 until the interpreter exits.

    Args:
        dropped_to: a file descriptor that receives the lines filtered out. Default None:
            they are dropped.
    """
    global _installed
    sys.stderr.flush()
    previous = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    ours = os.fstat(2)
    reader = threading.Thread(target=_forward, args=(read_end, previous, dropped_to),
                              daemon=True, name="strategykit-stderr-filter")
    reader.start()
    _installed = True

    def restore() -> None:
        sys.stderr.flush()
        now = os.fstat(2)
        if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
            os.dup2(previous, 2)  # closes the pipe's last write end: the reader sees its end
        reader.join(timeout=2)

    atexit.register(restore)


def _forward(read_end: int, kept_to: int, dropped_to: int | None) -> None:
    """Copies the pipe line by line: TensorFlow's log lines to `dropped_to`, the rest on."""
    pending = b""
    after_log_line = False  # the last line written was one of TensorFlow's
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            pending += chunk
            lines = re.split(rb"(?<=[\r\n])", pending)
            pending = lines.pop()  # no line end yet (b"" when the chunk ended one)
            after_log_line = _write(kept_to, dropped_to, lines, after_log_line)
            starts = (b"", b"I", b"W", b"E", b"F") + ((b"\t",) if after_log_line else ())
            if pending[:1] not in starts and not pending[:1].isdigit():
                # No log line: a prompt or a progress bar, shown now.
                after_log_line = _write(kept_to, dropped_to, [pending], after_log_line)
                pending = b""
        _write(kept_to, dropped_to, [pending], after_log_line)


def _write(kept_to: int, dropped_to: int | None, lines: list[bytes],
           after_log_line: bool) -> bool:
    """Writes `lines` on: TensorFlow's to `dropped_to`, with the lines of a message that
    go on after its first (`\\t [[{{node ...}}]]`, tab-indented, as TensorFlow continues a
    status); returns whether the last line was one of TensorFlow's."""
    dropped = []
    for line in lines:
        after_log_line = (TF_LOG_LINE.match(line.decode(errors="replace")) is not None
                          or (after_log_line and line[:1] == b"\t"))
        dropped.append(after_log_line)
    for fd, drop in ((kept_to, False), (dropped_to, True)):
        data = b"".join(line for line, is_log in zip(lines, dropped) if is_log == drop)
        while fd is not None and data:
            data = data[os.write(fd, data):]
    return after_log_line
