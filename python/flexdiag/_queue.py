# SPDX-License-Identifier: MIT
"""Requests on a context's queue: the C request built from Python prompts, Handle, the results
and the iterator of finished images.

Owns: the flexdiag_request of a call (prompt texts or id lists as C arrays kept alive with it);
the per-request state the engine thread's callbacks fill (every finished image's tokens, in the
order they finished, and the request's end), behind the C `user` key of _native.py; Handle
(flexdiag_handle: wait in short slices so Ctrl+C reaches Python, cancel, status, stats, tokens,
result, release on close or garbage collection); ImageResult and TextResult; and finished(),
which yields the images of several requests as they finish. An exception raised by a user
callback is kept, cancels its request, and is raised again by result() or finished() in the
caller's thread; it never unwinds into C.
"""
import array
import ctypes as C
import dataclasses
import itertools
import threading
import time
import weakref

from . import _images as I
from . import _structs as S
from ._lib import Error, Status, check, init, lib, status
from ._native import Native, in_callback, lookup, register, unregister

_events = threading.Condition()  # an image finished or a request ended (any context)
_order = itertools.count()      # the order images finished in, across requests

WAIT_SLICE_S = 0.1  # longest C wait before Python gets the thread back (signals, close)


@dataclasses.dataclass
class ImageResult:
    """One generated image: its place in the request (prompt-major), its token grid (a numpy
    (h, w) int32 array, or a list of rows without numpy) and the decoded image (None when
    not asked for or the model has no decoder)."""
    index: int
    tokens: object
    image: object
    handle: object = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass
class TextResult:
    """One text continuation: its place in the request, the generated ids (through the end id
    when stop_at_eos ended it) and their text (None when the model has no tokenizer.json)."""
    index: int
    ids: list
    text: object
    handle: object = dataclasses.field(default=None, repr=False, compare=False)


class CRequest:
    """A flexdiag_request for prompts (a text, a list of texts or a list of id lists) and the
    sampling fields (None: the library's default); owns the arrays it points into."""

    def __init__(self, prompts, **sampling):
        self.struct = init(S.Request())
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(p, str) for p in prompts):
            self._texts = (C.c_char_p * len(prompts))(*[p.encode() for p in prompts])
            self.struct.prompts = self._texts
        elif prompts and all(hasattr(p, "__len__") and not isinstance(p, str) for p in prompts):
            self._set_ids(prompts)
        else:
            raise TypeError("prompts: give a text, a list of texts, or a list of token id "
                            "lists (BOS .. <begin_of_image> for images)")
        self.struct.n_prompts = len(prompts)
        S.fill(self.struct, sampling, "request")

    def _set_ids(self, prompts):
        self._ids = [(C.c_int32 * len(p))(*[int(v) for v in p]) for p in prompts]
        ptr = C.POINTER(C.c_int32)
        self._ptrs = (ptr * len(prompts))(*[C.cast(a, ptr) for a in self._ids])
        self._lens = (C.c_int32 * len(prompts))(*[len(p) for p in prompts])
        self.struct.prompt_ids = self._ptrs
        self.struct.prompt_lens = self._lens


def grids(flat, n, per):
    """n images of per tokens each from a flat int buffer: a numpy (n, side, side) array (or
    (n, per) when not square), else a list of lists of rows."""
    side = I.grid_side(per)
    np = I.numpy()
    if np is not None:
        a = np.frombuffer(flat, dtype=np.int32).copy()
        return a.reshape((n, side, side) if side else (n, per))
    flat = list(flat)
    return [I.token_rows(flat[i * per:(i + 1) * per], side) for i in range(n)]


class _Pending:
    """What the callbacks of one request record, read by its Handle and finished()."""

    def __init__(self, handle, on_image, on_token, on_done):
        self.handle = weakref.ref(handle)
        self.on_image, self.on_token, self.on_done = on_image, on_token, on_done
        self.finished = []  # (order, index, array('i') tokens)
        self.ended = False
        self.error = None   # what a user callback raised

    def call(self, h, fn, *args):
        """Run a user callback; an exception is kept and cancels the request."""
        if fn is None or self.error is not None:
            return
        try:
            fn(self.handle(), *args)
        except BaseException as e:  # nothing may unwind into C
            self.error = e
            lib().flexdiag_handle_cancel(h)


@S.IMAGE_FN
def _on_image(h, index, tokens, n, user):
    st = lookup(user)
    if st is None:
        return
    with in_callback():
        ids = array.array("i", C.string_at(tokens, 4 * n))
        with _events:
            st.finished.append((next(_order), index, ids))
            _events.notify_all()
        st.call(h, st.on_image, index, ids.tolist())


@S.TOKEN_FN
def _on_token(h, index, step, token, user):
    st = lookup(user)
    if st is not None:
        with in_callback():
            st.call(h, st.on_token, index, step, token)


@S.DONE_FN
def _on_done(h, code, user):
    st = unregister(user)
    if st is None:
        return
    with in_callback():
        st.call(h, st.on_done, status(code))
        with _events:
            st.ended = True
            _events.notify_all()


def submit_params(key, wait_for_room, on_token, **text):
    """flexdiag_submit_params with the trampolines (on_token only when asked: it runs per
    token), user = key."""
    sp = init(S.SubmitParams())
    sp.on_image, sp.on_done, sp.user = _on_image, _on_done, key
    if on_token is not None:
        sp.on_token = _on_token
    sp.wait_for_room = wait_for_room
    return S.fill(sp, text, "submit")


class Handle(Native):
    """A submitted request (flexdiag_handle). close() releases it; an unfinished request keeps
    running (cancel() first to stop it)."""

    def __init__(self, context, kind, on_image=None, on_token=None, on_done=None):
        super().__init__(context)
        self.context = context
        self.kind = kind  # "image" or "text"
        self._pending = _Pending(self, on_image, on_token, on_done)

    def _start(self, c, req, wait_for_room, **text):
        """flexdiag_submit of req on context pointer c."""
        key = register(self._pending)
        sp = submit_params(key, wait_for_room, self._pending.on_token, **text)
        ptr = C.c_void_p()
        try:
            check(lib().flexdiag_submit(c, C.byref(req.struct), C.byref(sp), C.byref(ptr)))
        except BaseException:
            unregister(key)
            raise
        self._ptr = ptr.value
        self.context.model._handles.add(self)

    def _destroy(self, ptr):
        lib().flexdiag_handle_release(ptr)

    def wait(self, timeout=None):
        """Wait until the request ended, at most timeout seconds (None: no limit); whether it
        ended."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE_S if end is None else min(WAIT_SLICE_S, end - time.monotonic())
            with self._call() as ptr:
                if lib().flexdiag_handle_wait(ptr, max(left, 0.0)) == Status.OK:
                    return True
            if end is not None and time.monotonic() >= end:
                return False

    def cancel(self):
        """Stop it: waiting images are dropped, live ones stop at their next step."""
        with self._call() as ptr:
            check(lib().flexdiag_handle_cancel(ptr))

    @property
    def status(self):
        """Status.BUSY while it runs, then its final status."""
        st = C.c_int()
        with self._call() as ptr:
            check(lib().flexdiag_handle_status(ptr, C.byref(st), None))
        return status(st.value)

    @property
    def done(self):
        return self.status != Status.BUSY

    @property
    def error(self):
        """The message of its failure ("" while it runs or when it succeeded)."""
        with self._call() as ptr:
            return lib().flexdiag_handle_error(ptr).decode("utf-8", "replace")

    def stats(self):
        """Counts and timings (seconds from submit; -1: not yet) as a dict."""
        st, hs = C.c_int(), S.HandleStats(struct_size=C.sizeof(S.HandleStats))
        with self._call() as ptr:
            check(lib().flexdiag_handle_status(ptr, C.byref(st), C.byref(hs)))
        return S.as_dict(hs)

    def _token_buffer(self):
        """(flat int32 buffer, images, tokens per image) of flexdiag_handle_tokens."""
        out = S.Output()
        with self._call() as ptr:
            check(lib().flexdiag_handle_tokens(ptr, C.byref(out)))
            buf = (C.c_int32 * (out.n_images * out.tokens_per_image))()
            out.tokens = buf
            check(lib().flexdiag_handle_tokens(ptr, C.byref(out)))
        return buf, out.n_images, out.tokens_per_image

    def tokens(self):
        """Every image's tokens as the library keeps them (an unfinished image is zeros): a
        numpy (n, tokens_per_image) array, or a list of lists."""
        buf, n, per = self._token_buffer()
        np = I.numpy()
        if np is not None:
            return np.frombuffer(buf, dtype=np.int32).reshape(n, per).copy()
        return [list(buf[i * per:(i + 1) * per]) for i in range(n)]

    def raise_failure(self, cancelled_ok=False):
        """Raise what a callback raised, else Error for a failed request (a cancelled one too,
        unless cancelled_ok)."""
        err = self._pending.error or self.context.take_callback_error()
        if err is not None:
            self._pending.error = None
            raise err
        st = self.status
        if st != Status.OK and not (cancelled_ok and st == Status.CANCELLED):
            raise Error(st, self.error)

    def result(self, image_format="auto"):
        """Wait for it and return its results: a list of ImageResult (images decoded per
        image_format, None for tokens only) or of TextResult, in request order. Raises Error
        when it failed or was cancelled, or what a callback raised. Ctrl+C cancels it."""
        try:
            self.wait()
        except KeyboardInterrupt:
            self.cancel()
            self.wait()
            raise
        self.raise_failure()
        if self.kind == "text":
            done = sorted((index, ids) for _, index, ids in self._pending.finished)
            return [self.make_result(i, ids, None) for i, ids in done]
        buf, n, per = self._token_buffer()
        g = grids(buf, n, per)
        images = self._decode(g, image_format)
        return [ImageResult(i, g[i], images[i], self) for i in range(n)]

    def _decode(self, g, image_format):
        model = self.context.model
        if image_format is None or not model.image_size[0] or not len(g):
            return [None] * len(g)
        return model.decode(g, image_format)

    def make_result(self, index, ids, image_format):
        """The result of one finished image or sequence of this request (tokens array('i'))."""
        if self.kind == "text":
            return TextResult(index, ids.tolist(), self.context.model.detokenize(ids), self)
        g = grids(ids, 1, len(ids))
        return ImageResult(index, g[0], self._decode(g, image_format)[0], self)


def _take_new(handles, taken):
    """(new finished entries as (order, k, index, tokens), all ended), under _events."""
    new = []
    for k, h in enumerate(handles):
        f = h._pending.finished
        new += [(o, k, i, t) for o, i, t in f[taken[k]:]]
        taken[k] = len(f)
    return new, all(h._pending.ended for h in handles)


def finished(handles, image_format="auto"):
    """Yield the results of handles (a Handle or several) as their images finish, in that
    order; once all ended, raise what a callback raised or the Error of a failed request (a
    cancelled request just ends)."""
    handles = [handles] if isinstance(handles, Handle) else list(handles)
    taken = [0] * len(handles)
    while True:
        with _events:
            new, ended = _take_new(handles, taken)
            while not new and not ended:
                _events.wait(WAIT_SLICE_S)
                new, ended = _take_new(handles, taken)
        for _, k, index, ids in sorted(new):
            yield handles[k].make_result(index, ids, image_format)
        if ended and not new:
            break
    for h in handles:
        h.wait()
        h.raise_failure(cancelled_ok=True)
