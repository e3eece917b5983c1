"""Images for media tests, made with Pillow (and one by hand: the decompression bomb)."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

EXIF_ORIENTATION = 0x0112
EXIF_MAKE = 0x010F


def encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def solid(width: int, height: int, fmt: str = "PNG", color="red") -> bytes:
    return encoded(Image.new("RGB", (width, height), color), fmt)


def left_red_right_blue_jpeg(width: int, height: int, orientation: int) -> bytes:
    """A JPEG whose stored pixels are red on the left, blue on the right, with an EXIF
    orientation tag and a camera make that a thumbnail must not carry."""
    image = Image.new("RGB", (width, height), "blue")
    image.paste("red", (0, 0, width // 2, height))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    exif[EXIF_MAKE] = "SecretCam"
    return encoded(image, "JPEG", exif=exif.tobytes(), quality=95)


def animated_gif(frames: int, size: int = 64) -> bytes:
    colors = ["red", "green", "blue", "yellow", "white"]
    images = [Image.new("RGB", (size, size), colors[i % len(colors)]) for i in range(frames)]
    return encoded(images[0], "GIF", save_all=True, append_images=images[1:], duration=100, loop=0)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def bomb_png(width: int, height: int) -> bytes:
    """A valid RGB PNG of zeros: under a megabyte on disk, width*height*3 bytes decoded."""
    compressor = zlib.compressobj(1)
    row = b"\x00" * (1 + 3 * width)  # filter byte + pixels
    rows_per_block = max(1, (8 << 20) // len(row))
    idat = []
    left = height
    while left:
        n = min(left, rows_per_block)
        idat.append(compressor.compress(row * n))
        left -= n
    idat.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", b"".join(idat))
        + _chunk(b"IEND", b"")
    )
