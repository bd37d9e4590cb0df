"""Files tiermem writes for its users (checkpoints, results, calibration): written to a
temporary name beside the target, fsynced, renamed over it and the folder fsynced, so a crash
at any moment leaves the old file or the new one, never a torn one. Temporary files a killed
process left behind are removed by the next write to the same path."""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import IO, Any

from .exceptions import InvalidArgumentError

log = logging.getLogger(__name__)

_TMP = ".tmp-"


def check_writable(path: str, what: str) -> None:
    """Refuse, before any work, a ``path`` whose folder is missing or not writable, or that is
    a folder itself (a long run must not end in a missing-folder error and lose its results)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{what} {path!r} is a folder; give a file name")
    if os.path.exists(path) and not os.path.isfile(path):
        raise InvalidArgumentError(f"{what} {path!r} is not a regular file (a device or a pipe); give a file name")
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"{what} {path!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"{what} {path!r}: the folder {folder!r} is not writable")
    if held_by_a_table(path):
        raise InvalidArgumentError(
            f"{what} {path!r} is a live table's or device's file (open and locked by tiermem): writing there "
            "would replace it under its owner; give another path"
        )


def held_by_a_table(path: str) -> bool:
    """Whether ``path`` (never followed if a link) is a file a live tiermem table or device
    holds locked."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove ``path``'s temporary files whose writer process is gone; returns them."""
    gone = []
    for tmp in glob.glob(glob.escape(path) + _TMP + "*"):
        pid = tmp.rsplit(_TMP, 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
                gone.append(tmp)
    return gone


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` atomically: yields a file open on a temporary name; on a clean exit it is
    fsynced and renamed over ``path`` and the folder fsynced; on an exception it is removed
    and ``path`` is untouched."""
    check_writable(path, "output file")
    remove_stale_temporaries(path)
    tmp = f"{path}{_TMP}{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # this process's own leftover
    # O_EXCL|O_NOFOLLOW: a name planted at the temporary path is never written through.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    f = os.fdopen(fd, mode if "x" in mode else mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


def write_json_atomic(path: str, data: Any) -> None:
    """``json.dump(data)`` to ``path`` with :func:`atomic_write`; an unwritable target
    (a full disk, ``/dev/full``) is a clear error naming it."""
    try:
        with atomic_write(path, "w") as f:
            json.dump(data, f, indent=1)
    except OSError as e:
        raise InvalidArgumentError(f"cannot write {path!r}: {e.strerror or e}") from None


# Files removed at interpreter exit ----------------------------------------------------------

#: Path -> the process that registered it (a forked child removes none of its parent's).
_AT_EXIT: dict[str, int] = {}
_AT_EXIT_LOCK = threading.Lock()
#: What a table file brings with it: its optimizer companion, a relayout's or a snapshot's
#: temporary.
COMPANIONS = (".optim", ".optim.tmp", ".relayout", ".partial", ".journal")


def remove_at_exit(path: str) -> None:
    """Remove the scratch table file ``path`` (and its companions) when the interpreter exits,
    however it exits short of SIGKILL (the CLI turns SIGTERM and SIGHUP into an exit), unless
    :func:`remove_now` removed it first."""
    with _AT_EXIT_LOCK:
        _AT_EXIT[os.path.abspath(path)] = os.getpid()


def remove_now(path: str) -> None:
    """Remove ``path`` and its companions now (missing ones are fine) and forget it."""
    full = os.path.abspath(path)
    with _AT_EXIT_LOCK:
        _AT_EXIT.pop(full, None)
    for p in (full, *(full + c for c in COMPANIONS)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


@atexit.register
def _remove_at_exit() -> None:
    me = os.getpid()
    with _AT_EXIT_LOCK:
        paths = sorted(p for p, pid in _AT_EXIT.items() if pid == me)
    for p in paths:
        try:
            remove_now(p)
        except OSError as e:
            log.warning("could not remove the scratch table file %s at exit: %s", p, e)
    from . import _tiermem  # the device files the core created and still holds

    _tiermem.remove_device_files()
