# SPDX-License-Identifier: MIT
"""The life of the C objects behind Runtime, Model, Context and Handle, and the callback registry.

Owns: one pointer per Python object, freed once by close() (also on `with` exit, garbage
collection and interpreter exit); calls in flight counted so that close() waits for them (a
context's close cancels its requests first) and a call after close raises ClosedError; the
children a close takes down first, in the order the header asks (contexts before their model,
models before their runtime, a model's handles after its contexts). C callbacks find their
Python state through an integer key passed as the C `user` pointer, never through a pointer
to a Python object, and the trampolines are module-level functions that live as long as the
process, so a request that outlives its Python objects still calls into valid code.
"""
import atexit
import contextlib
import itertools
import threading
import weakref

from ._lib import ClosedError

_tls = threading.local()
_registry = {}          # key -> the Python state of a context or a request
_keys = itertools.count(1)
_roots = weakref.WeakSet()  # live runtimes, closed at interpreter exit


def register(state):
    """A key for state, passed to C as `user`; drop it with unregister."""
    key = next(_keys)
    _registry[key] = state
    return key


def lookup(key):
    return _registry.get(key)


def unregister(key):
    return _registry.pop(key, None)


@contextlib.contextmanager
def in_callback():
    """Mark the running thread as inside a C callback for the duration."""
    _tls.in_callback = True
    try:
        yield
    finally:
        _tls.in_callback = False


def running_callback():
    """Whether this thread is a context's engine thread inside a callback."""
    return getattr(_tls, "in_callback", False)


class Native:
    """Owner of one C pointer; subclasses give _destroy and, optionally, _interrupt."""

    _groups = ()  # names of WeakSet attributes holding children, closed in this order

    def __init__(self, parent=None):
        self._ptr = None
        self._cv = threading.Condition()
        self._busy = 0
        self._parent = parent  # kept alive while this object is: the C object needs it
        for g in self._groups:
            setattr(self, g, weakref.WeakSet())

    @property
    def closed(self):
        return self._ptr is None

    @contextlib.contextmanager
    def _call(self):
        """The pointer for one call; close() waits until the call is over."""
        with self._cv:
            if self._ptr is None:
                raise ClosedError(f"{type(self).__name__} is closed")
            self._busy += 1
        try:
            yield self._ptr
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()

    def _interrupt(self, ptr):
        """Make the calls in flight on ptr return (a context cancels them)."""

    def _destroy(self, ptr):
        raise NotImplementedError

    def close(self):
        """Free the C object (children first); idempotent. Calls in flight end first."""
        for g in self._groups:
            for child in list(getattr(self, g)):
                child.close()
        with self._cv:
            ptr, self._ptr = self._ptr, None
            if ptr is None:
                return
            self._interrupt(ptr)
            while self._busy:
                self._cv.wait()
        self._destroy(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if running_callback():  # an engine thread cannot wait for itself: close beside it
                threading.Thread(target=self.close, daemon=True).start()
            else:
                self.close()
        except Exception:
            pass


@atexit.register
def _close_all():
    """Contexts' engine threads stop before the interpreter that their callbacks enter."""
    for rt in list(_roots):
        rt.close()
