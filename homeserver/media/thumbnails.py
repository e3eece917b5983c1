"""Thumbnails with Pillow: probing originals, choosing sizes, rendering.

`probe` and `render` decode untrusted images and are CPU-bound: callers run them on a native
threadpool, never on the gevent hub. Both work from the path of an original, local or a cached
remote copy alike. Before anything is decoded the header's dimensions are checked against
`max_image_pixels` (a decompression bomb is small on disk and huge once decoded); Pillow's own
`Image.MAX_IMAGE_PIXELS` is process-global state, so it is only a second line.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from PIL import Image, ImageOps, ImageSequence

from homeserver.media.files import ThumbnailKey

# The content types we try to thumbnail; anything else gets 400 M_UNKNOWN, as from Synapse.
THUMBNAILABLE_TYPES = frozenset({"image/jpeg", "image/jpg", "image/png", "image/gif", "image/webp"})
# Only these decoders ever see untrusted bytes: each one is attack surface.
_PILLOW_FORMATS = ("JPEG", "PNG", "GIF", "WEBP")

# The spec's recommended sizes, made when an image is uploaded.
PREGENERATED_SIZES = (
    (32, 32, "crop"),
    (96, 96, "crop"),
    (320, 240, "scale"),
    (640, 480, "scale"),
    (800, 600, "scale"),
)

# Each frame of an animation is decoded at full size: an animated thumbnail may decode this
# many times max_image_pixels in all, or it is made from the first frame only.
ANIMATION_PIXEL_FACTOR = 10
# And at most this many frames, however small: each decoded frame and each thumbnail frame is
# an image held in memory, and a 1x1 GIF may have a million frames in a few megabytes.
MAX_ANIMATION_FRAMES = 500

_EXIF_ORIENTATION = 0x0112
_TRANSPOSE_FOR_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = {5, 6, 7, 8}


class ImageTooLarge(Exception):
    """More pixels than max_image_pixels: refused before decoding."""


class NotAnImage(Exception):
    """Not an image we decode, or a broken one."""


@dataclass(frozen=True)
class SourceImage:
    width: int  # after EXIF orientation
    height: int
    animated: bool  # more than one frame, and within the animation budget


def refusal_returned(fn, *args):
    """`(fn(*args), None)`, or `(None, refusal)` when the image is refused. For the thread
    pool: gevent prints a traceback for any exception a pool thread raises, and a refused
    image is an answer, not a bug."""
    try:
        return fn(*args), None
    except (ImageTooLarge, NotAnImage) as e:
        return None, e


def is_thumbnailable(content_type: str | None) -> bool:
    return base_type(content_type) in THUMBNAILABLE_TYPES


def base_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


# --- sizes -------------------------------------------------------------------------------


def thumbnail_size(
    source_width: int, source_height: int, width: int, height: int, method: str
) -> tuple[int, int]:
    """The size of the thumbnail for a request. Never larger than the source.

    scale: the source's aspect ratio, fitting within width x height.
    crop: exactly the requested aspect ratio; the largest such area of the source when the
    source is smaller than the request in either dimension.
    """
    if method == "crop":
        if source_width >= width and source_height >= height:
            return width, height
        if source_width * height >= source_height * width:  # source wider than requested
            return max(1, source_height * width // height), source_height
        return source_width, max(1, source_width * height // width)
    if source_width <= width and source_height <= height:
        return source_width, source_height
    if width * source_height <= height * source_width:  # the width binds
        return width, max(1, source_height * width // source_width)
    return max(1, source_width * height // source_height), height


def key_for(
    source: SourceImage,
    source_type: str | None,
    width: int,
    height: int,
    method: str,
    animated: bool,
) -> ThumbnailKey:
    """What thumbnail answers a request: its size, method and content type."""
    w, h = thumbnail_size(source.width, source.height, width, height, method)
    animated = animated and source.animated
    if animated:
        content_type = "image/webp"  # the spec's preference for animated thumbnails
    elif base_type(source_type) in ("image/jpeg", "image/jpg"):
        content_type = "image/jpeg"
    else:
        content_type = "image/png"  # keeps transparency
    return ThumbnailKey(w, h, method, content_type, animated)


def pregenerated_keys(source: SourceImage, source_type: str | None) -> list[ThumbnailKey]:
    keys = [
        key_for(source, source_type, w, h, method, animated=False)
        for w, h, method in PREGENERATED_SIZES
    ]
    return list(dict.fromkeys(keys))  # a small source gives the same size more than once


def select_thumbnail(stored, wanted: ThumbnailKey):
    """The smallest stored thumbnail that serves `wanted`: same method and type, at least as
    large, and for crop the same aspect ratio. None if there is none."""
    fits = [
        t
        for t in stored
        if t.method == wanted.method
        and t.content_type == wanted.content_type
        and t.animated == wanted.animated
        and t.width >= wanted.width
        and t.height >= wanted.height
        and (wanted.method != "crop" or t.width * wanted.height == t.height * wanted.width)
    ]
    return min(fits, key=lambda t: t.width * t.height, default=None)


# --- decoding ----------------------------------------------------------------------------


def _open(path: str, max_pixels: int) -> Image.Image:
    """Opens an image and reads its header only; refuses it if it has too many pixels."""
    try:
        image = Image.open(path, formats=_PILLOW_FORMATS)
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(str(e)) from None
    except Exception as e:  # decoders of untrusted bytes raise all kinds of errors
        raise NotAnImage(str(e)) from None
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise ImageTooLarge(f"{width}x{height} is over {max_pixels} pixels")
    return image


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(_EXIF_ORIENTATION) or 1)
    except Exception:  # EXIF is untrusted and its parser raises many things: ignore it
        return 1


def probe(path: str, max_pixels: int) -> SourceImage:
    """The size and animation of an original, from its header. Decodes no pixels."""
    with _open(path, max_pixels) as image:
        width, height = image.size
        if _orientation(image) in _SWAPS_AXES:
            width, height = height, width
        try:
            frames = getattr(image, "n_frames", 1)  # walks the frame headers, decodes nothing
        except Exception:
            frames = 1
        animated = _animation_fits(frames, width, height, max_pixels)
        return SourceImage(width, height, animated)


def _animation_fits(frames: int, width: int, height: int, max_pixels: int) -> bool:
    """Whether an animation may be decoded whole: frames x pixels within its budget."""
    return (
        1 < frames <= MAX_ANIMATION_FRAMES
        and frames * width * height <= ANIMATION_PIXEL_FACTOR * max_pixels
    )


def render(path: str, keys: list[ThumbnailKey], max_pixels: int) -> list[bytes]:
    """Encodes each thumbnail in `keys` from the original at `path`, decoding it once."""
    try:
        with _open(path, max_pixels) as image:
            orientation = _orientation(image)
            still = [k for k in keys if not k.animated]
            rendered: dict[ThumbnailKey, bytes] = {}
            if still:
                if image.format == "JPEG":
                    # Decode at the smallest 1/2, 1/4 or 1/8 scale still large enough.
                    image.draft(None, _draft_size(image.size, orientation, still))
                frame = _oriented(_rgb_or_rgba(image), orientation)
                for key in still:
                    rendered[key] = _encode(_resized(frame, key), key.content_type)
            for key in keys:
                if key.animated:
                    rendered[key] = _render_animated(image, key, orientation, max_pixels)
            return [rendered[k] for k in keys]
    except (ImageTooLarge, NotAnImage):
        raise
    except Exception as e:  # truncated or corrupt data, in any of the decoders' ways
        raise NotAnImage(str(e)) from None


def _draft_size(size: tuple[int, int], orientation: int, keys: list[ThumbnailKey]):
    """The smallest decoded size (in the file's own orientation) every key can be made from."""
    width, height = size
    if orientation in _SWAPS_AXES:
        width, height = height, width
    need_w = need_h = 1
    for key in keys:
        if key.method == "crop":  # covers the key's box, then the excess is cut off
            factor = max(key.width / width, key.height / height)
            w, h = math.ceil(width * factor), math.ceil(height * factor)
        else:
            w, h = key.width, key.height
        need_w, need_h = max(need_w, w), max(need_h, h)
    return (need_h, need_w) if orientation in _SWAPS_AXES else (need_w, need_h)


def _rgb_or_rgba(image: Image.Image) -> Image.Image:
    # Palette and grey images resize badly (nearest colours); RGB(A) resizes smoothly.
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    wanted = "RGBA" if has_alpha else "RGB"
    return image if image.mode == wanted else image.convert(wanted)


def _oriented(image: Image.Image, orientation: int) -> Image.Image:
    method = _TRANSPOSE_FOR_ORIENTATION.get(orientation)
    return image.transpose(method) if method is not None else image


def _resized(image: Image.Image, key: ThumbnailKey) -> Image.Image:
    size = (key.width, key.height)
    if key.method == "crop":
        return ImageOps.fit(image, size, Image.Resampling.LANCZOS)
    return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


def _without_metadata(image: Image.Image) -> Image.Image:
    # EXIF (camera, GPS, orientation already applied), XMP and text chunks are dropped; the
    # colour profile is kept, as it changes how the pixels look.
    icc = image.info.get("icc_profile")
    image.info = {"icc_profile": icc} if icc else {}
    return image


def _encode(image: Image.Image, content_type: str) -> bytes:
    image = _without_metadata(image)
    out = io.BytesIO()
    if content_type == "image/jpeg":
        (image if image.mode == "RGB" else image.convert("RGB")).save(out, "JPEG", quality=80)
    else:
        image.save(out, "PNG")
    return out.getvalue()


def _render_animated(
    image: Image.Image, key: ThumbnailKey, orientation: int, max_pixels: int
) -> bytes:
    frames, durations = [], []
    budget = ANIMATION_PIXEL_FACTOR * max_pixels
    decoded = 0
    for index, frame in enumerate(ImageSequence.Iterator(image)):
        decoded += frame.size[0] * frame.size[1]
        if decoded > budget or index >= MAX_ANIMATION_FRAMES:
            raise ImageTooLarge("animation over its decoding budget")
        rgba = _oriented(frame.convert("RGBA"), orientation)
        frames.append(_without_metadata(_resized(rgba, key)))
        duration = frame.info.get("duration")
        durations.append(image.info.get("duration", 100) if duration is None else duration)
    out = io.BytesIO()
    frames[0].save(
        out,
        "WEBP",
        save_all=True,
        append_images=frames[1:],
        duration=durations,
        loop=image.info.get("loop", 0),
        quality=80,
    )
    return out.getvalue()
