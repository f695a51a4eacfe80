# SPDX-License-Identifier: MIT
"""Loading libflexdiag and turning its statuses into exceptions.

Owns: finding the shared library (FLEXDIAG_LIBRARY, then the linker's search path), the
prototypes of every C function the binding calls (include/flexdiag.h), the API version check,
the Status codes and the Error exception. The library is loaded on first use, not at import,
so ``import flexdiag`` works before the library is built or installed.
"""
import ctypes
import ctypes.util
import enum
import os
import threading

from . import _structs as S

# The binding uses the request queue (flexdiag_submit, flexdiag_handle_*): API version 12.
MIN_API_VERSION = 12

_HOW_TO_FIND = (
    "build it (meson setup build && ninja -C build) and point FLEXDIAG_LIBRARY at the "
    "library (export FLEXDIAG_LIBRARY=$PWD/build/libflexdiag.so), or install it "
    "(meson install -C build && ldconfig)")


class Status(enum.IntEnum):
    """flexdiag_status of include/flexdiag.h (values never change; new codes are appended)."""
    OK = 0
    INVALID_ARG = -1
    UNSUPPORTED = -2
    NOT_FOUND = -3
    IO = -4
    NO_SPACE = -5
    CORRUPT_MODEL = -6
    CHECKSUM = -7
    OOM_DEVICE = -8
    OOM_PINNED = -9
    OOM_HOST = -10
    CUDA = -11
    CANCELLED = -12
    BUSY = -13
    NUMERIC = -14
    INTERNAL = -15
    TIMEOUT = -16


def status(code):
    """code as a Status member; a code newer than this binding stays a plain int."""
    try:
        return Status(code)
    except ValueError:
        return int(code)


class Error(Exception):
    """A failed libflexdiag call: .status (Status, an int) and .message (the library's text)."""

    def __init__(self, code, message):
        super().__init__(code, message)  # args as given: it pickles
        self.status = status(code)
        self.message = message

    def __str__(self):
        return f"{self.message} [{self.status_name}]"

    @property
    def status_name(self):
        """The status as a name ("INVALID_ARG"), also for codes newer than this binding."""
        if isinstance(self.status, Status):
            return self.status.name
        return f"status {int(self.status)}"


class LibraryError(OSError):
    """libflexdiag was not found, could not be loaded, or is older than this binding."""


class ClosedError(ValueError):
    """A Runtime, Model, Context or Handle was used after close()."""


_c = ctypes
_vp = _c.c_void_p
_i32 = _c.c_int32
_p_i32 = _c.POINTER(_c.c_int32)
_p_f32 = _c.POINTER(_c.c_float)
_st = _c.c_int  # flexdiag_status

# name -> (restype, argtypes), in the order of include/flexdiag.h
_PROTOTYPES = {
    "flexdiag_api_version": (_c.c_uint32, []),
    "flexdiag_version": (_c.c_char_p, []),
    "flexdiag_device_count": (_c.c_int, []),
    "flexdiag_status_str": (_c.c_char_p, [_st]),
    "flexdiag_last_error": (_c.c_char_p, [_vp]),
    "flexdiag_runtime_params_init": (None, [_vp]),
    "flexdiag_runtime_create": (_st, [_c.POINTER(S.RuntimeParams), _c.POINTER(_vp)]),
    "flexdiag_runtime_destroy": (None, [_vp]),
    "flexdiag_runtime_budget": (_st, [_vp, _c.POINTER(_c.c_uint64)]),
    "flexdiag_model_params_init": (None, [_vp]),
    "flexdiag_model_load": (_st, [_vp, _c.c_char_p, _c.POINTER(S.ModelParams),
                                  _c.POINTER(_vp)]),
    "flexdiag_model_destroy": (None, [_vp]),
    "flexdiag_model_image_size": (_st, [_vp, _p_i32, _p_i32]),
    "flexdiag_decode_images": (_st, [_vp, _p_i32, _i32, _p_f32]),
    "flexdiag_context_params_init": (None, [_vp]),
    "flexdiag_request_init": (None, [_vp]),
    "flexdiag_context_create": (_st, [_vp, _c.POINTER(S.ContextParams), _c.POINTER(_vp)]),
    "flexdiag_context_max_images": (_st, [_vp, _c.POINTER(S.ContextParams), _p_i32]),
    "flexdiag_generate": (_st, [_vp, _c.POINTER(S.Request), _c.POINTER(S.Output)]),
    "flexdiag_context_cancel": (_st, [_vp]),
    "flexdiag_context_stats": (_st, [_vp, _vp]),
    "flexdiag_context_destroy": (None, [_vp]),
    "flexdiag_context_offload": (_st, [_vp, _c.POINTER(S.OffloadInfo)]),
    "flexdiag_model_eos": (_st, [_vp, _p_i32]),
    "flexdiag_detokenize": (_st, [_vp, _p_i32, _i32, _c.c_bool, _c.c_char_p, _c.c_size_t,
                                  _c.POINTER(_c.c_size_t)]),
    "flexdiag_policy_name": (_c.c_char_p, [_c.c_int]),
    "flexdiag_policy_from_name": (_st, [_c.c_char_p, _c.POINTER(_c.c_int)]),
    "flexdiag_context_policy": (_st, [_vp, _c.POINTER(S.PolicyInfo)]),
    "flexdiag_score_request_init": (None, [_vp]),
    "flexdiag_score": (_st, [_vp, _c.POINTER(S.ScoreRequest), _c.POINTER(S.ScoreOutput)]),
    "flexdiag_submit_params_init": (None, [_vp]),
    "flexdiag_submit": (_st, [_vp, _c.POINTER(S.Request), _c.POINTER(S.SubmitParams),
                              _c.POINTER(_vp)]),
    "flexdiag_handle_wait": (_st, [_vp, _c.c_double]),
    "flexdiag_handle_cancel": (_st, [_vp]),
    "flexdiag_handle_status": (_st, [_vp, _c.POINTER(_st), _c.POINTER(S.HandleStats)]),
    "flexdiag_handle_tokens": (_st, [_vp, _c.POINTER(S.Output)]),
    "flexdiag_handle_error": (_c.c_char_p, [_vp]),
    "flexdiag_handle_release": (None, [_vp]),
}

_lock = threading.Lock()
_lib = None


def _open():
    """The CDLL of FLEXDIAG_LIBRARY, else of the name the linker knows; LibraryError if none."""
    path = os.environ.get("FLEXDIAG_LIBRARY")
    if path:
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            raise LibraryError(f"FLEXDIAG_LIBRARY={path}: cannot load it ({e}); point it at "
                               "a built libflexdiag.so") from None
    for name in (ctypes.util.find_library("flexdiag"), "libflexdiag.so.0"):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    raise LibraryError(f"libflexdiag not found: {_HOW_TO_FIND}")


def _bind(lib):
    """Set every prototype; a missing symbol means a library older than API version 12."""
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryError(f"{lib._name} has no {name}: it is older than this binding "
                               f"needs (API version {MIN_API_VERSION}); {_HOW_TO_FIND}") from None
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded, checked library (loaded once, on first use)."""
    global _lib
    with _lock:
        if _lib is None:
            handle = _open()
            have = handle.flexdiag_api_version() if hasattr(handle, "flexdiag_api_version") else 0
            if have < MIN_API_VERSION:
                raise LibraryError(f"{handle._name} has API version {have}, but this binding "
                                   f"needs {MIN_API_VERSION} or newer: {_HOW_TO_FIND}")
            _bind(handle)
            _lib = handle
        return _lib


# Bytes a params struct's _init() (or flexdiag_context_stats, whose struct has no struct_size)
# may write: a newer library's struct is longer than the binding's and it fills the whole of
# it; the library reads no struct_size above this (runtime/api_check.h).
INIT_SCRATCH = 4096


def init(struct):
    """Fill struct (a params Structure of _structs.py) with the library's defaults through its
    _init() function, then set struct_size to the binding's sizeof; returns struct."""
    scratch = ctypes.create_string_buffer(INIT_SCRATCH)
    getattr(lib(), S.INIT[type(struct)])(scratch)
    ctypes.memmove(ctypes.addressof(struct), scratch, ctypes.sizeof(struct))
    struct.struct_size = ctypes.sizeof(struct)
    return struct


def last_error():
    """The calling thread's message of its last failing call."""
    return lib().flexdiag_last_error(None).decode("utf-8", "replace")


def check(code):
    """Raise Error for a status other than OK, with this thread's last message."""
    if code != Status.OK:
        msg = last_error() or lib().flexdiag_status_str(code).decode()
        raise Error(code, msg)


def api_version():
    """API version of the loaded library (FLEXDIAG_API_VERSION of its header)."""
    return int(lib().flexdiag_api_version())


def version():
    """Version string of the loaded library (e.g. "0.4.0")."""
    return lib().flexdiag_version().decode()


def device_count():
    """CUDA devices the library can run on (0 without CUDA)."""
    return int(lib().flexdiag_device_count())
