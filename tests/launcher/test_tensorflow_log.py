"""The stderr filter (`strategykit.launcher.tensorflow_log`) copies a pipe on without
TensorFlow's log lines, and without the lines a message of TensorFlow's goes on with
(`\\t [[{{node ...}}]]` under `Local rendezvous is aborting with status: ...`: one such line
reached a notebook's cell); every other line, tab-indented ones included, passes."""

import os
import threading

from strategykit.launcher.tensorflow_log import _forward

RENDEZVOUS = (b"I0000 00:00:1796414679.366354    7433 local_rendezvous.cc:405] Local "
              b"rendezvous is aborting with status: OUT_OF_RANGE: End of sequence\n")
NODE = b"\t [[{{node remotecall_target/_2}}]] [type.googleapis.com/tensorflow.DerivedStatus='']\n"


def _filtered(*writes: bytes) -> tuple[bytes, bytes]:
    """What `_forward` keeps and drops of `writes`, each one write to its pipe."""
    pipe_read, pipe_write = os.pipe()
    kept_read, kept_write = os.pipe()
    dropped_read, dropped_write = os.pipe()
    reader = threading.Thread(target=_forward, args=(pipe_read, kept_write, dropped_write))
    reader.start()
    for data in writes:
        os.write(pipe_write, data)
    os.close(pipe_write)
    reader.join(timeout=10)
    os.close(kept_write)
    os.close(dropped_write)
    with os.fdopen(kept_read, "rb") as kept, os.fdopen(dropped_read, "rb") as dropped:
        return kept.read(), dropped.read()


def test_a_tensorflow_message_is_dropped_with_the_lines_it_goes_on_with():
    kept, dropped = _filtered(b"Epoch 1/2\n" + RENDEZVOUS + NODE + b"Epoch 2/2\n")
    assert kept == b"Epoch 1/2\nEpoch 2/2\n"
    assert dropped == RENDEZVOUS + NODE


def test_the_line_that_goes_on_is_dropped_when_it_comes_in_a_write_of_its_own():
    kept, dropped = _filtered(RENDEZVOUS, NODE[:5], NODE[5:], b"done\n")
    assert (kept, dropped) == (b"done\n", RENDEZVOUS + NODE)


def test_tab_indented_lines_of_the_user_pass_and_so_does_a_prompt():
    user = b"loss\n\t0.25\n\tindented\n"
    kept, dropped = _filtered(user + RENDEZVOUS + b"after\n\tmine\n", b"\tprompt> ")
    assert (kept, dropped) == (user + b"after\n\tmine\n\tprompt> ", RENDEZVOUS)
