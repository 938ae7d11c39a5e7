"""The integrity record of a backup of `sk.callbacks.BackupAndRestore`: sealed, verified.

`seal` writes `integrity.json` into a finished backup folder, last: the size and the
sha256 of every other file in it, each file flushed to disk first, the record itself
written aside and moved into place (`os.replace`) and flushed, so a record present is a
record whole. It also makes the backup private (folder 0700, files 0600). `problem_of`
reads a backup back: it names the first file that is missing, of another size, of other
bytes, or (the JSON files) not readable JSON, and `None` for a sound backup. A backup
without a record (torn before it was sealed, or written by a strategykit before backups
had one) is never sound: nothing says its files are the ones written.
"""

from __future__ import annotations

import hashlib
import json
import os

INTEGRITY = "integrity.json"
_JSON_FILES = ("training_metadata.json", "strategykit.json")  # what a resume reads
_REQUIRED = ("latest.weights.h5", "training_metadata.json")  # Keras's backup
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def seal(backup: str) -> None:
    """Makes `backup` private and writes its integrity record, last and atomically."""
    os.chmod(backup, PRIVATE_DIR)
    files = {}
    for name in sorted(os.listdir(backup)):
        path = os.path.join(backup, name)
        os.chmod(path, PRIVATE_FILE)
        files[name] = {"size": os.path.getsize(path), "sha256": _sha256(path, sync=True)}
    aside = os.path.join(backup, INTEGRITY + ".tmp")
    descriptor = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(descriptor, "w") as file:
        json.dump({"version": 1, "files": files}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(aside, os.path.join(backup, INTEGRITY))
    sync_directory(backup)


def problem_of(backup: str) -> tuple[str, str] | None:
    """What is wrong with the backup folder `backup`, or None when it is sound.

    Returns:
        `(file, what is wrong)`, e.g. `("latest.weights.h5", "missing")`.

    Example:
        >>> import tempfile
        >>> problem_of(tempfile.mkdtemp())[0]
        'integrity.json'
    """
    try:
        with open(os.path.join(backup, INTEGRITY)) as file:
            files = json.load(file)["files"]
    except FileNotFoundError:
        return INTEGRITY, ("missing: the backup has no integrity record (torn before it "
                           "was sealed, or written by an older strategykit, before "
                           "backups had one), so nothing says its files are whole")
    except (ValueError, KeyError, TypeError) as error:
        return INTEGRITY, f"not a readable integrity record ({error})"
    for name in _REQUIRED:
        if name not in files:
            return name, "not in the backup's integrity record: it was never written"
    for name, expected in files.items():
        path = os.path.join(backup, name)
        if not os.path.isfile(path):
            return name, "missing"
        size = os.path.getsize(path)
        if size != expected["size"]:
            return name, (f"{size} bytes instead of the {expected['size']} written "
                          f"({'truncated' if size < expected['size'] else 'grown'})")
        if _sha256(path) != expected["sha256"]:
            return name, "changed: its bytes are not those written (sha256 differs)"
    for name in _JSON_FILES:
        if name in files:
            try:
                with open(os.path.join(backup, name)) as file:
                    json.load(file)
            except ValueError as error:
                return name, f"torn JSON ({error})"
    return None


def sync_directory(path: str) -> None:
    """Flushes the entries of the directory `path` (a rename in it) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sha256(path: str, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
        if sync:
            os.fsync(file.fileno())
    return digest.hexdigest()
