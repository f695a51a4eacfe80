# SPDX-License-Identifier: MIT
"""Token grids and decoded pixels as Python values, with numpy and Pillow optional.

Owns: looking up the optional modules at call time (so a program, or a test, that blocks them
gets the plain-Python path), the token grid shapes, the float -> uint8 conversion of the
decoder's pixels (the CLI's cli/image_out.c rule: fp32 (x + 1) / 2 * 255, clipped to [0, 255],
truncated, NaN -> 0) and the image types: a PIL image, a numpy (H, W, 3) uint8 array, or a
RawImage (width, height, RGB bytes) that can still write itself as a PNG.
"""
import array
import importlib
import math
import struct
import zlib

FORMATS = ("auto", "pil", "numpy", "raw")


def optional(name):
    """The module `name`, or None when it is not importable (or blocked in sys.modules)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def numpy():
    return optional("numpy")


def resolve_format(fmt):
    """The concrete image format for fmt ("auto": Pillow, else numpy, else raw)."""
    if fmt not in FORMATS:
        raise ValueError(f"image_format {fmt!r}: use one of {', '.join(FORMATS)} "
                         "(or None for no images)")
    if fmt == "auto":
        return "pil" if optional("PIL.Image") else ("numpy" if numpy() else "raw")
    need = {"pil": ("PIL.Image", "Pillow (python3-pil, pip install Pillow)"),
            "numpy": ("numpy", "numpy (python3-numpy, pip install numpy)")}.get(fmt)
    if need and not optional(need[0]):
        raise ImportError(f"image_format {fmt!r} needs {need[1]}; or use 'raw'")
    return fmt


class RawImage:
    """An 8-bit RGB image without Pillow or numpy: width, height and rows of RGB bytes."""

    def __init__(self, width, height, data):
        self.width, self.height, self.data = width, height, bytes(data)

    @property
    def size(self):
        return (self.width, self.height)

    def save(self, path):
        """Write it as a PNG file (zlib, no other module)."""
        with open(path, "wb") as f:
            f.write(png_bytes(self.width, self.height, self.data))

    def __repr__(self):
        return f"RawImage({self.width}x{self.height} RGB)"


def _chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def png_bytes(width, height, rgb):
    """An 8-bit RGB PNG of width x height pixels (rgb: height rows of 3 * width bytes)."""
    stride = 3 * width
    rows = b"".join(b"\0" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(rows))
            + _chunk(b"IEND", b""))


def save_png(image, path):
    """Write image (PIL image, numpy (H, W, 3) uint8 array or RawImage) to path as a PNG."""
    if isinstance(image, RawImage):
        image.save(path)
    elif hasattr(image, "save"):
        image.save(path, format="PNG")
    else:
        h, w, _ = image.shape
        RawImage(w, h, image.astype("uint8").tobytes()).save(path)


def u8_plain(floats):
    """bytes of the uint8 pixels of an iterable of fp32 decoder outputs, in plain Python.

    Rounding each step through array('f') gives the fp32 results: x + 1 is rounded once, the
    halving is exact and the product of an fp32 value and 255 is exact in a double before its
    one rounding to fp32."""
    plus_one = array.array("f", (x + 1.0 for x in floats))
    scaled = array.array("f", (y * 0.5 * 255.0 for y in plus_one))
    return bytes(0 if not v > 0.0 else (255 if v > 255.0 else int(v)) for v in scaled)


def u8_numpy(np, pixels):
    """uint8 array of a float32 numpy array of decoder outputs (same rule, vectorised)."""
    v = (pixels + np.float32(1.0)) / np.float32(2.0) * np.float32(255.0)
    v = np.where(v > 0, v, np.float32(0.0))  # also NaN
    return np.minimum(v, np.float32(255.0)).astype(np.uint8)


def image_from_u8(fmt, width, height, rgb):
    """An image of format fmt ("pil", "numpy", "raw") from RGB bytes or a uint8 array."""
    if fmt == "raw":
        return RawImage(width, height, rgb if isinstance(rgb, bytes) else rgb.tobytes())
    if fmt == "pil":
        pil = optional("PIL.Image")
        return pil.frombytes("RGB", (width, height),
                             rgb if isinstance(rgb, bytes) else rgb.tobytes())
    np = numpy()
    if isinstance(rgb, bytes):
        return np.frombuffer(rgb, dtype=np.uint8).reshape(height, width, 3).copy()
    return rgb.reshape(height, width, 3)


def grid_side(per_image):
    """The side of a square token grid of per_image tokens, 0 when it is not square."""
    side = math.isqrt(per_image)
    return side if side * side == per_image else 0


def token_rows(flat, side):
    """A flat image's tokens as a list of rows (side of them), or the flat list (side 0)."""
    flat = list(flat)
    if not side:
        return flat
    return [flat[r * side:(r + 1) * side] for r in range(side)]


def flatten_grids(grids):
    """(n, flat int list) of a sequence of images given as grids, flat lists or a numpy array."""
    np = numpy()
    if np is not None and isinstance(grids, np.ndarray):
        a = np.ascontiguousarray(grids, dtype=np.int32)
        return a.shape[0], a.reshape(-1).tolist()
    flat = []
    for g in grids:
        for v in g:
            if hasattr(v, "__len__"):
                flat.extend(int(x) for x in v)
            else:
                flat.append(int(v))
    return len(grids), flat
