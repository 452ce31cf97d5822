"""``Waker``: how any thread (a backward hook above all) wakes the worker's communication
thread, which polls the read end of a pipe beside its sockets. One byte per idle spell,
never blocking, and the GIL kept through the write."""
from __future__ import annotations

import ctypes
import os

_write_keeping_gil = ctypes.PyDLL(None).write  # libc's, called with the GIL held (see ``wake``)
_write_keeping_gil.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
_write_keeping_gil.restype = ctypes.c_ssize_t


class Waker:
    def __init__(self):
        self.fd, self._write_fd = os.pipe()  # the thread polls ``fd``
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)  # written with the GIL held: it must never block
        # set by the first wake since the thread last took its commands: later wakes skip the
        # pipe write (a syscall, 12% of the training thread's backward hooks in py-spy)
        self.due = False

    def wake(self) -> None:
        if self.due:
            return  # a byte is in the pipe since the thread last took its commands
        self.due = True
        # libc's write, not os.write, which lets the GIL go: the thread it wakes took it then and
        # worked while the backward waited in its hook (0.58 ms a wake on a CPU worker). Kept, the
        # hook returns to autograd first. A full pipe (-1, EAGAIN): it is due to wake anyway.
        _write_keeping_gil(self._write_fd, b"x", 1)

    def taken(self) -> None:
        """The thread was woken: called before it takes its commands, so that a command put
        after this finds ``due`` False and writes a byte that is still to be read."""
        try:
            os.read(self.fd, 65536)
        except BlockingIOError:
            pass
        self.due = False

    def close(self) -> None:
        """The thread's end (callers may still wake it: the write end stays open)."""
        os.close(self.fd)
