# SPDX-License-Identifier: MIT
"""flexdiag: Python binding of libflexdiag (include/flexdiag.h) over ctypes.

    import flexdiag
    with flexdiag.Runtime(device=-1) as rt, flexdiag.Model(rt, arch="tiny-janus") as model, \\
            flexdiag.Context(model, max_images=4) as ctx:
        for r in ctx.generate("a red apple", images_per_prompt=2, seed=1):
            flexdiag.save_png(r.image, f"apple-{r.index}.png")

Runtime -> Model -> Context mirror the C objects (close() or `with` frees them; a use after
close raises ClosedError). Failed calls raise Error (.status, .message). The library is found
through FLEXDIAG_LIBRARY or the linker's search path on first use. numpy and Pillow are used
when importable, not required. python/README.md has the whole guide.
"""
from ._context import PHASE_DECODE, PHASE_PREFILL, Context, Scores
from ._images import RawImage, save_png
from ._lib import (MIN_API_VERSION, ClosedError, Error, LibraryError, Status, api_version,
                   device_count, version)
from ._objects import Model, Runtime
from ._queue import Handle, ImageResult, TextResult

__version__ = "0.6.0"

__all__ = ["Runtime", "Model", "Context", "Handle", "ImageResult", "TextResult", "Scores",
           "RawImage", "save_png", "Error", "LibraryError", "ClosedError", "Status",
           "api_version", "version", "device_count", "MIN_API_VERSION", "PHASE_PREFILL",
           "PHASE_DECODE"]
