"""`STRATEGYKIT_PROGRESS_FILE` names a path from the environment: a worker writes its
progress there without following a link or replacing a file that is not its report."""

import json
import os
import re
import stat

import pytest

from strategykit.launcher.progress_file import ProgressFile, read

FIX = re.escape("Name a path where nothing is yet, in a folder of your own, or leave "
                "STRATEGYKIT_PROGRESS_FILE unset (strategykit launch sets it, in a private "
                "folder).")


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("precious")
    return path


def test_a_symbolic_link_is_refused_and_what_it_points_to_untouched(tmp_path, victim):
    link = tmp_path / "worker-0.json"
    link.symlink_to(victim)
    with pytest.raises(ValueError, match=r"STRATEGYKIT_PROGRESS_FILE names a symbolic link "
                       rf"\(to '{re.escape(str(victim))}'\), which it would not follow\. "
                       rf"Received: '{re.escape(str(link))}'\. {FIX}"):
        ProgressFile(str(link))
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("planted, what", [
    ("folder", "a folder"),
    ("other file", "a file that is no progress report, which it would replace"),
    ("fifo", "no regular file"),
    ("no folder", "a file in a folder that does not exist"),
])
def test_a_path_that_is_no_report_of_its_own_is_refused(tmp_path, planted, what):
    path = tmp_path / "worker-0.json"
    if planted == "folder":
        path.mkdir()
    elif planted == "other file":
        path.write_text("someone's notes")
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        path = tmp_path / "gone" / "worker-0.json"
    message = f"STRATEGYKIT_PROGRESS_FILE names {what}. Received: '{path}'. "
    with pytest.raises(ValueError, match=re.escape(message) + FIX):
        ProgressFile(str(path))
    if planted == "other file":
        assert path.read_text() == "someone's notes"


def test_an_earlier_report_is_replaced_by_a_file_of_mode_0600(tmp_path):
    path = tmp_path / "worker-0.json"
    path.write_text(json.dumps({"step": 9, "heartbeat": 1.0}))
    progress = ProgressFile(str(path))
    progress.record(epoch=1, step=2)
    progress.write()
    assert read(str(path))["step"] == 2
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["worker-0.json"]


def test_a_link_planted_between_writes_stops_the_writes(tmp_path, victim):
    path = tmp_path / "worker-0.json"
    progress = ProgressFile(str(path))
    progress.write()
    path.unlink()
    path.symlink_to(victim)
    with pytest.raises(ValueError, match="names a symbolic link"):
        progress.write()
    assert victim.read_text() == "precious" and path.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["victim", "worker-0.json"]  # no temporary left


def test_the_launcher_reads_no_link_and_waits_on_no_fifo(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"step": 1, "heartbeat": 1.0}))
    (tmp_path / "link.json").symlink_to(report)
    os.mkfifo(tmp_path / "fifo.json")
    assert read(str(report))["step"] == 1
    assert read(str(tmp_path / "link.json")) is None
    assert read(str(tmp_path / "fifo.json")) is None
