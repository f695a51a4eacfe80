# SPDX-License-Identifier: MIT
"""Runtime and Model: the process-wide objects of include/flexdiag.h.

Owns: params structs filled from keyword arguments (the header's field names; the _init()
defaults for the rest), runtime and model creation, and the model's queries: image size, end
id, pixel decoding of token grids and detokenization. Contexts live in _context.py.
"""
import ctypes as C
import os

from . import _images as I
from . import _structs as S
from ._context import context_params
from ._lib import Error, Status, check, init, lib
from ._native import Native, _roots


class Runtime(Native):
    """Devices, memory budgets and kernels (flexdiag_runtime). Keyword arguments are the fields
    of flexdiag_runtime_params: device (-1: the CPU engine), gpu_mem, threads, cpu_mem,
    disk_mem, offload_dir."""

    _groups = ("_models",)

    def __init__(self, **params):
        super().__init__()
        p = init(S.RuntimeParams())
        S.fill(p, params, "Runtime")
        ptr = C.c_void_p()
        check(lib().flexdiag_runtime_create(C.byref(p), C.byref(ptr)))
        self._ptr = ptr.value
        _roots.add(self)

    def _destroy(self, ptr):
        lib().flexdiag_runtime_destroy(ptr)

    @property
    def budget(self):
        """Device memory budget in bytes that contexts are sized against (0: none)."""
        b = C.c_uint64()
        with self._call() as ptr:
            check(lib().flexdiag_runtime_budget(ptr, C.byref(b)))
        return b.value


class Model(Native):
    """A loaded model (flexdiag_model), read-only and shared by its contexts.

    path: a model folder (config.json + safetensors), or None for a builtin shape named by
    arch ("tiny-janus", "micro-janus", "micro-opt", ...; seeded random weights). The other
    keyword arguments are the fields of flexdiag_model_params (seed, weights_pct,
    compress_weights)."""

    _groups = ("_contexts", "_handles")

    def __init__(self, runtime, path=None, **params):
        super().__init__(runtime)
        p = init(S.ModelParams())
        S.fill(p, params, "Model")
        ptr = C.c_void_p()
        with runtime._call() as rt:
            check(lib().flexdiag_model_load(rt, os.fsencode(path) if path else None,
                                            C.byref(p), C.byref(ptr)))
        self._ptr = ptr.value
        runtime._models.add(self)
        self._tokenizer = None  # unknown until the first detokenize
        self._image_size = None

    def _destroy(self, ptr):
        lib().flexdiag_model_destroy(ptr)

    @property
    def image_size(self):
        """(height, width) of decoded images; (0, 0) without an image decoder."""
        if self._image_size is None:
            h, w = C.c_int32(), C.c_int32()
            with self._call() as ptr:
                check(lib().flexdiag_model_image_size(ptr, C.byref(h), C.byref(w)))
            self._image_size = (h.value, w.value)
        return self._image_size

    @property
    def eos(self):
        """The id a text continuation ends at, or None (image models)."""
        e = C.c_int32()
        with self._call() as ptr:
            check(lib().flexdiag_model_eos(ptr, C.byref(e)))
        return e.value if e.value >= 0 else None

    def max_images(self, **params):
        """The largest max_images whose context fits the runtime's budget (needs a budget:
        a GPU, or gpu_mem on the CPU engine)."""
        out = C.c_int32()
        p = context_params(params)
        with self._call() as ptr:
            check(lib().flexdiag_context_max_images(ptr, C.byref(p), C.byref(out)))
        return out.value

    def decode(self, grids, image_format="auto"):
        """Images of token grids (a sequence of grids or flat id lists, or a numpy array of
        shape (n, h, w) or (n, h * w)): PIL images, numpy (H, W, 3) uint8 arrays or RawImage,
        by image_format ("auto": the first of those that is importable)."""
        fmt = I.resolve_format(image_format)
        n, flat = I.flatten_grids(grids)
        h, w = self.image_size
        if not h:
            raise Error(Status.UNSUPPORTED, "this model has no image decoder: use the tokens")
        tokens = (C.c_int32 * len(flat))(*flat)
        px = h * w * 3
        np = I.numpy()
        if np is not None:
            pix = np.empty((n, h, w, 3), dtype=np.float32)
            self._decode(tokens, n, pix.ctypes.data_as(C.POINTER(C.c_float)))
            return [I.image_from_u8(fmt, w, h, I.u8_numpy(np, pix[i])) for i in range(n)]
        pix = (C.c_float * (n * px))()
        self._decode(tokens, n, pix)
        return [I.image_from_u8(fmt, w, h, I.u8_plain(pix[i * px:(i + 1) * px]))
                for i in range(n)]

    def _decode(self, tokens, n, pixels):
        with self._call() as ptr:
            check(lib().flexdiag_decode_images(ptr, tokens, n, pixels))

    def detokenize(self, ids, skip_special=True):
        """The text of token ids under the model's tokenizer.json; None without one."""
        if self._tokenizer is False:
            return None
        ids = (C.c_int32 * len(ids))(*ids)
        size = C.c_size_t()
        with self._call() as ptr:
            st = lib().flexdiag_detokenize(ptr, ids, len(ids), skip_special, None, 0,
                                           C.byref(size))
            if st == Status.NOT_FOUND:
                self._tokenizer = False
                return None
            check(st)
            buf = C.create_string_buffer(size.value + 1)
            check(lib().flexdiag_detokenize(ptr, ids, len(ids), skip_special, buf, len(buf),
                                            C.byref(size)))
        self._tokenizer = True
        return buf.raw[:size.value].decode("utf-8", "replace")
