"""The output of `strategykit launch`'s workers on the launcher's own stdout and stderr.

Every line a worker writes is forwarded to the launcher's stream of the same name with
the prefix `[worker k] `. Lines end at `\\n` or `\\r`, and backspaces (`\\b`) are dropped:
that is how a Keras progress bar redraws itself (`\\b\\b...\\r3/10 ━━━━ - loss: 1.2`).
The chief's (worker 0's) `\\r` updates stay updates, `\\r[worker 0] 3/10 ━━━━ ...`, so
the terminal shows one live progress bar; a Keras bar line (it holds "━", U+2501) of any
other worker is dropped, since every worker draws the same bar. Nothing else is dropped.
A worker's line that ends with `\\r` and is no Keras bar (a tqdm bar, say) is shown as a
line of its own when the worker is not the chief. The output is linear in the input: an
update the chief is still writing goes on where it stopped (only its new part is
written), of several updates read at once only the last is drawn, and a line longer than
`MAX_LINE_CHARS` is forwarded in pieces, each a line of its own.

A Python traceback on a worker's stderr may be held back (`hold_tracebacks`): from its
`Traceback (most recent call last):` line on (or from a task TensorFlow names unhealthy,
which its error lists on a line of its own), the worker's stderr lines wait until the
launcher knows whether that worker is the one at fault. When a peer is, the traceback
only echoes it (an all-reduce that lost the peer) and goes to a log file instead
(`take_held`); otherwise it is shown as it was written (`release`). Every line is also
scanned for the tasks TensorFlow names unhealthy (`unhealthy_workers`) and for a network
or host that could not be reached (`saw_unreachable`).

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> terminal = Terminal(out, io.StringIO())
    >>> worker_1 = LineForwarder(terminal, worker=1, stream="stdout")
    >>> worker_1.feed(b"Epoch 1/2\\n\\r1/5 \\xe2\\x94\\x81\\xe2\\x94\\x81 - loss: 0.9\\n")
    >>> worker_1.close()
    >>> out.getvalue()
    '[worker 1] Epoch 1/2\\n'
"""

from __future__ import annotations

import codecs
import os
import re
import threading
import time
from typing import TextIO

TRACEBACK = "Traceback (most recent call last):"
"""The first line of a Python traceback: a worker's stderr is held from there on."""
_UNHEALTHY = re.compile(r"unhealthy \(stopped sending heartbeats\):?((?:\s*/job:worker/"
                        r"replica:\d+/task:\d+,?)+)")
_TASK = re.compile(r"/job:worker/replica:\d+/task:(\d+)")
_UNREACHABLE = re.compile(r"Network is unreachable|Temporary failure in name resolution|Name or "
                          r"service not known|No address associated with hostname|Could not "
                          r"resolve host|\[Errno (101|-2|-3)\]")

PROGRESS_BAR = "\u2501"
"""The character Keras's progress bar is drawn with: a line holding it is a bar."""

CHIEF = 0
MAX_LINE_CHARS = 1 << 16
"""The longest line forwarded whole; a longer one comes in pieces of this length."""


class Terminal:
    """The launcher's stdout and stderr, shared by the output of every worker.

    At most one line is open at a time: the chief's progress bar, drawn without its line
    end so the next `\\r` update can redraw it. Any other output first ends that line, so
    lines of different workers never run into each other.

    Args:
        stdout: where the workers' stdout goes (a text stream).
        stderr: where the workers' stderr and the launcher's own messages go.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()
        self._open: tuple[str, int] | None = None  # (stream, worker) of the open line
        self._open_text = ""  # what the open line shows after its prefix

    def write(self, stream: str, worker: int, text: str, *, redraw: bool, ended: bool) -> None:
        """Writes one line of a worker's output with its prefix.

        Args:
            stream: `"stdout"` or `"stderr"`.
            worker: the worker's index.
            text: the line, without its line end.
            redraw: draw it over the line the same worker left open (`\\r` first); when
                that line shows the start of `text`, only the rest of `text` is written.
            ended: end the line (`\\n`); otherwise it stays open for the next redraw.
        """
        with self._lock:
            same = redraw and self._open == (stream, worker)
            if self._open is not None and not same:
                self._end_open_line()
            if same and text.startswith(self._open_text):  # the line goes on: its new part
                line = text[len(self._open_text):]
            else:
                line = ("\r" if redraw else "") + f"[worker {worker}] {text}"
            if line or ended:
                _write(self._streams[stream], line + ("\n" if ended else ""))
            self._open, self._open_text = (None, "") if ended else ((stream, worker), text)

    def end(self, stream: str, worker: int) -> None:
        """Ends the worker's line on `stream` if the terminal still shows it open."""
        with self._lock:
            if self._open == (stream, worker):
                self._end_open_line()

    def note(self, message: str) -> None:
        """Writes a message of the launcher itself to stderr, on a line of its own."""
        with self._lock:
            self._end_open_line()
            _write(self._streams["stderr"], f"strategykit launch: {message}\n")

    def _end_open_line(self) -> None:
        if self._open is not None:
            _write(self._streams[self._open[0]], "\n")
            self._open, self._open_text = None, ""


class LineForwarder:
    """Splits one output stream of one worker into lines and writes them to the terminal.

    Feed it the bytes as they come (`feed`), then `close` it at the end of the stream;
    a last line without a line end is written then, so no output is lost.

    Args:
        terminal: the launcher's `Terminal`.
        worker: the worker's index; worker 0 is the chief.
        stream: `"stdout"` or `"stderr"`.
        hold_tracebacks: hold back a Python traceback on stderr until `release` or
            `take_held` is called.
    """

    def __init__(self, terminal: Terminal, worker: int, stream: str,
                 hold_tracebacks: bool = False):
        self._terminal, self._worker, self._stream = terminal, worker, stream
        self._hold = hold_tracebacks and stream == "stderr"
        self._held: list[str] = []
        self.held_since: float | None = None
        """When the traceback held now began (`time.time()`); None when none is."""
        self.unhealthy_workers: list[int] = []
        """The workers this worker's TensorFlow named unhealthy, in the order named."""
        self.saw_unreachable = False
        """Whether a line said that a network or a host name could not be reached."""
        self._recent = ""  # the last lines, for a message of TensorFlow's split over lines
        self._lock = threading.Lock()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # the current line so far
        self._after_return = False  # the current line follows a `\r`: it is an update
        self._drawn: str | None = None  # the chief's update the terminal shows open

    def feed(self, data: bytes) -> None:
        """Forwards every line completed by `data`, and the chief's update in progress.

        Of the chief's `\\r` updates that `data` completes one after the other, only the
        last is drawn (the terminal would show nothing else of them), and a line longer
        than `MAX_LINE_CHARS` is forwarded in pieces, each a line of its own: the output
        stays within a small multiple of the input, however long a line gets.
        """
        *parts, rest = re.split(r"([\r\n])", self._decoder.decode(data).replace("\b", ""))
        texts, ends = parts[::2], parts[1::2]
        for i, (text, end) in enumerate(zip(texts, ends)):
            text, self._pending = self._pending + text, ""
            after = texts[i + 1] if i + 1 < len(texts) else rest  # what follows in `data`
            if self._worker == CHIEF and end == "\r" and text and after:
                self._after_return = True  # an update drawn over at once: not drawn
                continue
            self._end_line(text, end)
        self._pending += rest
        while len(self._pending) > MAX_LINE_CHARS:
            piece, self._pending = (self._pending[:MAX_LINE_CHARS],
                                    self._pending[MAX_LINE_CHARS:])
            self._end_line(piece, "\n")
        chief_update = self._worker == CHIEF and self._after_return
        if chief_update and self._pending and self._pending != self._drawn:
            self._draw(self._pending)

    def close(self) -> None:
        """Forwards what is left at the end of the stream as a last line."""
        self._pending += self._decoder.decode(b"", final=True).replace("\b", "")
        if self._pending or self._drawn is not None:
            self._end_line(self._pending, "\n")
            self._pending = ""

    def _end_line(self, text: str, end: str) -> None:
        if self._worker == CHIEF:
            if end == "\r" and text and text != self._drawn:
                self._draw(text)
            elif end == "\n" and not text and self._drawn is not None:  # `\r\n`, or the end
                self._terminal.end(self._stream, self._worker)
                self._drawn = None
            elif end == "\n":
                redraw = self._after_return or self._drawn is not None
                self._emit(text, redraw=redraw, ended=True)
                self._drawn = None
        elif PROGRESS_BAR not in text and (text or (end == "\n" and not self._after_return)):
            self._emit(text, redraw=False, ended=True)
        self._after_return = end == "\r"

    def _draw(self, text: str) -> None:
        self._emit(text, redraw=True, ended=False)
        self._drawn = text

    def _emit(self, text: str, *, redraw: bool, ended: bool) -> None:
        if self._stream == "stderr":  # where TensorFlow and tracebacks write
            self._note_unhealthy(text)
        with self._lock:
            if self._hold and (self._held or text.startswith(TRACEBACK)
                               or _TASK.fullmatch(text.strip())):
                if not self._held:
                    self.held_since = time.time()
                self._held.append(text)
                return
        self._terminal.write(self._stream, self._worker, text, redraw=redraw, ended=ended)

    def release(self) -> None:
        """Shows the traceback held back, as it was written; later lines pass at once."""
        with self._lock:
            held, self._held, self.held_since = self._held, [], None
        for text in held:
            self._terminal.write(self._stream, self._worker, text, redraw=False, ended=True)

    def take_held(self) -> list[str]:
        """The lines of the traceback held back, taken instead of shown."""
        with self._lock:
            held, self._held, self.held_since = self._held, [], None
        return held

    def _note_unhealthy(self, text: str) -> None:
        self.saw_unreachable = self.saw_unreachable or bool(_UNREACHABLE.search(text))
        self._recent = (self._recent + "\n" + text)[-2000:]
        named = _UNHEALTHY.search(self._recent)
        if named:
            for task in map(int, _TASK.findall(named.group(1))):
                if task not in self.unhealthy_workers:
                    self.unhealthy_workers.append(task)
            self._recent = self._recent[named.end():]


def forward(pipe_fd: int, forwarder: LineForwarder) -> threading.Thread:
    """Starts a thread that forwards a worker's pipe until its end, then closes the pipe.

    Args:
        pipe_fd: the read end of the worker's stdout or stderr pipe.
        forwarder: the `LineForwarder` of that worker and stream.

    Returns:
        The started daemon thread; join it to wait for the last line.
    """

    def run() -> None:
        try:
            while chunk := os.read(pipe_fd, 65536):
                forwarder.feed(chunk)
        finally:
            forwarder.close()
            os.close(pipe_fd)

    thread = threading.Thread(target=run, daemon=True, name="strategykit-worker-output")
    thread.start()
    return thread


def _write(stream: TextIO, text: str) -> None:
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show "━": a replacement instead
            encoding = stream.encoding or "utf-8"
            stream.write(text.encode(encoding, errors="replace").decode(encoding))
        stream.flush()
    except OSError:  # the launcher's output is gone (a closed pipe): the workers go on
        pass
