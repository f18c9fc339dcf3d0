"""Listening on a Unix socket (``openenv-gym serve --unix PATH``).

The socket file is made with mode 0600, so only its user can connect. Next to
it, ``PATH.lock`` is held (``flock``) while the server listens: two servers
started on one path cannot both take it, and a server never removes a socket
file that another one made. A socket file left by a server that is gone (it
refuses connections) is replaced. The lock file is left in place on exit, as
removing a lock file others may wait on is not safe; it is opened only if it
is a regular file of this user, never through a link.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat

__all__ = ["UnixListener", "MAX_PATH_BYTES"]

#: Longest socket path Linux accepts (``sun_path`` is 108 bytes with its NUL).
MAX_PATH_BYTES = 107

_PROBE_TIMEOUT = 1.0


class UnixListener:
    """A listening Unix socket at ``path`` and the lock that says it is ours.

    Args:
        path: the socket file (made absolute).
        backlog: the ``listen()`` backlog.

    Attributes:
        sock: the listening, non-blocking socket.
        path: the socket file.

    Raises:
        OSError: the path is too long, in use by a live server (or one being
            started), not a socket, or cannot be made.
    """

    def __init__(self, path: str, *, backlog: int = 1024) -> None:
        self.path = os.path.abspath(path)
        if len(os.fsencode(self.path)) > MAX_PATH_BYTES:
            raise OSError(f"a Unix socket path is at most {MAX_PATH_BYTES} bytes, got {len(os.fsencode(self.path))}: {self.path}")
        # Refusals that need no lock come first, so that they leave no lock file behind.
        if os.path.lexists(self.path) and not stat.S_ISSOCK(os.lstat(self.path).st_mode):
            raise OSError(f"{self.path} exists and is not a socket")
        if not os.path.isdir(os.path.dirname(self.path)):
            raise OSError(f"cannot make the socket {self.path}: its directory does not exist")
        self._lock: int | None = _open_lock(self.path + ".lock")
        try:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OSError(f"{self.path} is in use by another server") from None
            self._clear_stale()
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                umask = os.umask(0o177)  # the file is born 0600: no window in which others may connect
                try:
                    self.sock.bind(self.path)
                finally:
                    os.umask(umask)
                self._identity = _identity(os.lstat(self.path))
                self.sock.listen(backlog)
                self.sock.setblocking(False)
            except BaseException:
                self.sock.close()
                raise
        except BaseException:
            self._unlock()
            raise

    def _clear_stale(self) -> None:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise OSError(f"{self.path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(_PROBE_TIMEOUT)
            try:
                probe.connect(self.path)
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(self.path)  # left by a server that is gone
                return
            except OSError:  # a server that does not accept in time is still a server
                pass
        raise OSError(f"{self.path} is in use by a running server")

    def release(self) -> None:
        """Remove the socket file (if it is still the one made here) and let go of the lock.

        Call once the server has stopped listening; connections already open
        are not affected. Idempotent.
        """
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            if _identity(os.lstat(self.path)) == self._identity:
                os.unlink(self.path)
        self._unlock()

    def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)  # (closing it releases the flock)


def _open_lock(path: str) -> int:
    """Open (or make, 0600) the lock file ``path``: never through a link, and only a regular file of this user.

    Another user may plant ``PATH.lock`` as a link (to a file of theirs, or
    where a root server would make one) or as a FIFO (where ``open`` would
    block): ``O_NOFOLLOW`` refuses the link, ``O_NONBLOCK`` the wait, and the
    ``fstat`` of what was opened refuses any file that is not a regular one
    owned by this process's user.

    Raises:
        OSError: the path is a link, or not a regular file of this user.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(f"{path} is a symbolic link: a lock file is never followed; remove it") from None
        raise OSError(f"cannot open the lock file {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(f"{path} is not a regular file of this user: a lock file must be one; remove it")
    return fd


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_dev, st.st_ino, st.st_ctime_ns  # (an inode number alone may be reused at once)
