"""What `strategykit launch` writes on disk: a private folder, files it alone created.

A user of the same machine can plant a symbolic link or a folder at any path of a shared
temporary folder; the launcher must neither write through one nor fail because of one,
and what it writes must be readable by its user alone (files 0600, folders 0700).
"""

import io
import os
import signal
import stat
import sys
import tempfile
import threading

import pytest

from strategykit.launcher import held_output
from strategykit.launcher.launch import launch
from strategykit.launcher.private_files import RunFolder, open_private
from strategykit.launcher.worker_output import LineForwarder, Terminal

TIMEOUT = 60


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def victim(tmp_path):
    """A file of the user's that a planted link points to; it must stay as it is."""
    path = tmp_path / "victim"
    path.write_text("precious")
    path.chmod(0o600)
    return path


def planted(where, victim) -> dict:
    """A symbolic link to `victim`, a dangling one, a folder and a file, at `where`."""
    where.mkdir(exist_ok=True)
    paths = {kind: where / kind for kind in ("link", "dangling", "folder", "file")}
    paths["link"].symlink_to(victim)
    paths["dangling"].symlink_to(where / "nothing-here")
    paths["folder"].mkdir()
    paths["file"].write_text("someone else's")
    return paths


def test_a_private_file_is_created_0600_and_never_over_or_through_what_exists(tmp_path,
                                                                              victim):
    with open_private(str(tmp_path / "new.log")) as file:
        file.write("ok")
    assert mode(tmp_path / "new.log") == 0o600
    for path in planted(tmp_path / "planted", victim).values():
        with pytest.raises(OSError):
            open_private(str(path))
    assert victim.read_text() == "precious"
    assert not (tmp_path / "planted" / "nothing-here").exists()
    assert (tmp_path / "planted" / "file").read_text() == "someone else's"


def test_the_run_folder_is_0700_and_removed_unless_it_holds_a_log(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = RunFolder()
    assert mode(folder.path) == 0o700
    assert os.path.dirname(folder.path) == str(tmp_path)
    assert mode(folder.attempt_folder(0)) == 0o700
    assert folder.close() == [] and os.listdir(tmp_path) == []
    folder = RunFolder()
    folder.attempt_folder(0)
    with open_private(folder.log_path(0)) as log:
        log.write("echo")
    assert folder.close() == [folder.log_path(0)]
    assert os.listdir(folder.path) == ["attempt-0.log"]


def _held(terminal) -> list[LineForwarder]:
    stderrs = [LineForwarder(terminal, k, "stderr", hold_tracebacks=True) for k in range(2)]
    for forwarder in stderrs:
        forwarder.feed(b"Traceback (most recent call last):\nError\n")
    return stderrs


@pytest.mark.parametrize("kind", ["link", "dangling", "folder", "file"])
def test_echoes_are_shown_when_their_log_cannot_be_created(tmp_path, victim, kind):
    path = planted(tmp_path / "planted", victim)[kind]
    err = io.StringIO()
    terminal = Terminal(io.StringIO(), err)
    assert held_output.set_aside_echoes(_held(terminal), 1, str(path), terminal) == [0]
    assert f"strategykit launch: cannot create the log file for the error output of " \
           f"worker 0 (File exists: {path}); it follows here.\n" \
           "[worker 0] Traceback (most recent call last):\n[worker 0] Error\n" in err.getvalue()
    assert victim.read_text() == "precious"


def test_a_launch_follows_no_planted_link_and_survives_a_planted_folder(tmp_path, victim,
                                                                        monkeypatch, capsys):
    # Before: the logs were /tmp/strategykit-launch-<pid>-attempt-<n>.log, opened with
    # open(path, "w"). Both attempts of this job set worker 0's traceback aside in a log.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = {n: tmp_path / f"strategykit-launch-{os.getpid()}-attempt-{n}.log" for n in (0, 1)}
    old[0].symlink_to(victim)
    old[1].mkdir()
    worker = ("import os, stat, sys, time\n"
              "progress = os.path.dirname(os.environ['STRATEGYKIT_PROGRESS_FILE'])\n"
              "print(*(oct(stat.S_IMODE(os.lstat(p).st_mode)) for p in (progress, "
              "os.path.dirname(progress))), progress)\n"
              "if os.environ['STRATEGYKIT_WORKER'] == '0':\n"
              "    print('Traceback (most recent call last):', file=sys.stderr, flush=True)\n"
              "    time.sleep(30)\n"
              "time.sleep(1)\n"
              "sys.exit(3)\n")
    watchdog = threading.Timer(TIMEOUT, os.kill, (os.getpid(), signal.SIGTERM))
    watchdog.start()  # stops the launcher (exit 143) should it not end by itself
    try:
        code = launch([sys.executable, "-c", worker], workers=2, restarts=1, network="host")
    finally:
        watchdog.cancel()
    out, err = capsys.readouterr()
    assert code == 3, err
    folders = {line.split()[-1] for line in out.splitlines()}  # each attempt's reports
    assert {tuple(line.split()[2:4]) for line in out.splitlines()} == {("0o700", "0o700")}
    assert victim.read_text() == "precious" and old[1].is_dir()
    assert err.count("strategykit launch: worker 1 exited with code 3") == 2
    logs = [line.split(" is in ")[1].split(";")[0] for line in err.splitlines()
            if "the error output of worker 0, which follows from that, is in" in line]
    folder = os.path.dirname(logs[0])
    assert logs == [os.path.join(folder, f"attempt-{n}.log") for n in (0, 1)]
    assert os.path.dirname(folder) == str(tmp_path) and mode(folder) == 0o700
    assert sorted(os.listdir(folder)) == ["attempt-0.log", "attempt-1.log"]  # kept, named
    assert folders == {os.path.join(folder, f"attempt-{n}-progress") for n in (0, 1)}
    for log in logs:
        assert mode(log) == 0o600
        assert open(log).read() == "[worker 0] Traceback (most recent call last):\n"
