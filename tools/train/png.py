"""
png.py - PNG reading and writing with the standard library (zlib), for hosts without PIL.
Reads 8-bit greyscale, RGB, RGBA, grey+alpha and palette PNGs, non-interlaced (what flexdiag
writes: 8-bit RGB, non-interlaced); uses PIL instead when it is importable.
"""

import struct
import zlib

import numpy as np


def write(path, img):
    """img: uint8 [H, W, 3] -> 8-bit RGB PNG."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read(path):
    """uint8 [H, W, 3] (alpha dropped, greyscale expanded)."""
    try:
        from PIL import Image
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except ImportError:
        pass
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("%s: not a PNG" % path)
    pos, idat, plte = 8, [], None
    while pos < len(data):
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif tag == b"PLTE":
            plte = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
        pos += 12 + n
    if depth != 8 or interlace:
        raise ValueError("%s: only 8-bit non-interlaced PNGs are supported here (install PIL)"
                         % path)
    ch = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride = w * ch
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if ft == 0:
            cur = line
        elif ft == 2:
            cur = (line + prev) & 255
        elif ft in (1, 3, 4):
            cur = line.copy()
            for x in range(stride):
                a = cur[x - ch] if x >= ch else 0
                if ft == 1:
                    cur[x] = (cur[x] + a) & 255
                elif ft == 3:
                    cur[x] = (cur[x] + ((a + prev[x]) >> 1)) & 255
                else:
                    c = prev[x - ch] if x >= ch else 0
                    cur[x] = (cur[x] + _paeth(a, prev[x], c)) & 255
        else:
            raise ValueError("%s: bad PNG filter %d" % (path, ft))
        out[y] = cur
        prev = cur
    px = out.reshape(h, w, ch)
    if ctype == 3:
        return plte[px[..., 0]]
    if ch in (1, 2):
        return np.repeat(px[..., :1], 3, axis=2)
    return px[..., :3].copy()


def tile(imgs, cols):
    """uint8 [N, H, W, 3] -> one grid image with `cols` columns (black filler)."""
    n, h, w, _ = imgs.shape
    rows = (n + cols - 1) // cols
    out = np.zeros((rows * h, cols * w, 3), np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        out[r * h:(r + 1) * h, c * w:(c + 1) * w] = imgs[i]
    return out
