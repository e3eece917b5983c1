"""The thumbnailer on real images: sizes, selection, EXIF, animation, refusals."""

import io

import pytest
from PIL import Image

from homeserver.media.files import ThumbnailKey
from homeserver.media.thumbnails import (
    MAX_ANIMATION_FRAMES,
    ImageTooLarge,
    NotAnImage,
    SourceImage,
    key_for,
    pregenerated_keys,
    probe,
    render,
    select_thumbnail,
    thumbnail_size,
)
from homeserver.storage.media import StoredThumbnail
from tests.media.images import (
    EXIF_MAKE,
    EXIF_ORIENTATION,
    animated_gif,
    bomb_png,
    left_red_right_blue_jpeg,
    solid,
)


@pytest.mark.parametrize(
    "source, request_size, method, expected",
    [
        # scale keeps the source's aspect and fits the box
        ((1000, 500), (320, 240), "scale", (320, 160)),
        ((500, 1000), (320, 240), "scale", (120, 240)),
        ((1000, 500), (100, 100), "scale", (100, 50)),
        # never upscale: a source within the box stays as it is
        ((20, 10), (320, 240), "scale", (20, 10)),
        ((1000, 500), (5000, 5000), "scale", (1000, 500)),
        # crop gives exactly the requested size when the source is large enough
        ((1000, 500), (96, 96), "crop", (96, 96)),
        ((1000, 500), (200, 50), "crop", (200, 50)),
        # ...and otherwise the largest area of the requested aspect, without upscaling
        ((1000, 500), (700, 700), "crop", (500, 500)),
        ((1000, 500), (1200, 300), "crop", (1000, 250)),
        ((10, 20), (32, 32), "crop", (10, 10)),
    ],
)
def test_thumbnail_size(source, request_size, method, expected):
    assert thumbnail_size(*source, *request_size, method) == expected


def test_crop_keeps_the_requested_aspect_exactly():
    for source in [(1000, 500), (333, 777), (20, 10), (7, 3)]:
        for request in [(32, 32), (96, 96), (64, 48), (1200, 300)]:
            w, h = thumbnail_size(*source, *request, "crop")
            assert w <= source[0] and h <= source[1]
            # integer rounding may shave at most one pixel off the exact ratio
            assert abs(w * request[1] - h * request[0]) < max(request)


def test_pregenerated_keys_and_selection():
    source = SourceImage(1000, 500, animated=False)
    keys = pregenerated_keys(source, "image/jpeg")
    assert [(k.width, k.height, k.method) for k in keys] == [
        (32, 32, "crop"),
        (96, 96, "crop"),
        (320, 160, "scale"),
        (640, 320, "scale"),
        (800, 400, "scale"),
    ]
    assert {k.content_type for k in keys} == {"image/jpeg"}
    stored = [StoredThumbnail(k.width, k.height, k.method, k.content_type, False, 1) for k in keys]

    def chosen(width, height, method):
        found = select_thumbnail(
            stored, key_for(source, "image/jpeg", width, height, method, False)
        )
        return found and (found.width, found.height, found.method)

    assert chosen(32, 32, "crop") == (32, 32, "crop")
    assert chosen(64, 64, "crop") == (96, 96, "crop")  # the nearest larger one
    assert chosen(100, 100, "scale") == (320, 160, "scale")
    assert chosen(700, 500, "scale") == (800, 400, "scale")
    assert chosen(128, 96, "crop") is None  # no stored crop has a 4:3 aspect: made on demand
    assert chosen(5000, 5000, "scale") is None  # the full size was never pre-generated


def test_a_small_source_pregenerates_each_size_once():
    keys = pregenerated_keys(SourceImage(20, 10, False), "image/png")
    assert [(k.width, k.height, k.method) for k in keys] == [(10, 10, "crop"), (20, 10, "scale")]


def test_render_sizes_and_types(tmp_path):
    path = tmp_path / "original"
    path.write_bytes(solid(1000, 500, "JPEG"))
    source = probe(str(path), 10_000_000)
    assert source == SourceImage(1000, 500, False)
    keys = [
        key_for(source, "image/jpeg", 96, 96, "crop", False),
        key_for(source, "image/jpeg", 320, 240, "scale", False),
        ThumbnailKey(1000, 500, "scale", "image/png", False),
    ]
    outputs = render(str(path), keys, 10_000_000)
    images = [Image.open(io.BytesIO(data)) for data in outputs]
    assert [(i.format, i.size) for i in images] == [
        ("JPEG", (96, 96)),
        ("JPEG", (320, 160)),
        ("PNG", (1000, 500)),
    ]


def test_exif_orientation_is_applied_and_exif_is_stripped(tmp_path):
    path = tmp_path / "photo"
    # Orientation 6: the camera was turned; the picture displays rotated 90° clockwise, so
    # the stored left (red) half is the displayed top half.
    path.write_bytes(left_red_right_blue_jpeg(200, 100, orientation=6))
    source = probe(str(path), 10_000_000)
    assert (source.width, source.height) == (100, 200)
    key = key_for(source, "image/jpeg", 640, 480, "scale", False)
    thumb = Image.open(io.BytesIO(render(str(path), [key], 10_000_000)[0]))
    assert thumb.size == (100, 200)
    red, blue = thumb.convert("RGB").getpixel((50, 20)), thumb.convert("RGB").getpixel((50, 180))
    assert red[0] > 200 and red[2] < 60
    assert blue[2] > 200 and blue[0] < 60
    exif = thumb.getexif()
    assert EXIF_ORIENTATION not in exif and EXIF_MAKE not in exif
    assert "exif" not in thumb.info


def test_animation_is_kept_only_when_asked(tmp_path):
    path = tmp_path / "anim"
    path.write_bytes(animated_gif(frames=3))
    source = probe(str(path), 10_000_000)
    assert source.animated
    animated = key_for(source, "image/gif", 32, 32, "crop", animated=True)
    still = key_for(source, "image/gif", 32, 32, "crop", animated=False)
    assert (animated.content_type, still.content_type) == ("image/webp", "image/png")
    moving, static = (
        Image.open(io.BytesIO(d)) for d in render(str(path), [animated, still], 10_000_000)
    )
    assert moving.format == "WEBP" and moving.n_frames == 3 and moving.size == (32, 32)
    assert static.format == "PNG" and getattr(static, "n_frames", 1) == 1


def test_a_long_animation_is_thumbnailed_from_its_first_frame(tmp_path):
    path = tmp_path / "anim"
    path.write_bytes(animated_gif(frames=60, size=64))
    # 60 frames of 64x64 decode 245760 pixels in all: within ten times 40000, not 8192.
    assert probe(str(path), 40_000).animated
    long = probe(str(path), 8192)
    assert not long.animated
    key = key_for(long, "image/gif", 32, 32, "crop", animated=True)
    assert not key.animated and key.content_type == "image/png"


def test_an_animation_of_many_tiny_frames_is_bounded_by_its_frame_count(tmp_path):
    # 600 frames of 2x2: a few pixels in all, but each frame is an image held in memory.
    path = tmp_path / "anim"
    path.write_bytes(animated_gif(frames=MAX_ANIMATION_FRAMES + 100, size=2))
    many = probe(str(path), 10_000_000)
    assert not many.animated
    # Asked to render it animated all the same, it stops at the cap.
    with pytest.raises(ImageTooLarge):
        render(str(path), [ThumbnailKey(2, 2, "crop", "image/webp", True)], 10_000_000)
    path.write_bytes(animated_gif(frames=MAX_ANIMATION_FRAMES, size=2))
    assert probe(str(path), 10_000_000).animated


def test_decompression_bomb_is_refused_from_its_header(tmp_path):
    path = tmp_path / "bomb"
    path.write_bytes(bomb_png(8000, 8000))
    assert path.stat().st_size < 1_000_000
    with pytest.raises(ImageTooLarge):
        probe(str(path), 32_000_000)
    with pytest.raises(ImageTooLarge):
        render(str(path), [ThumbnailKey(32, 32, "crop", "image/png", False)], 32_000_000)
    # Within the limit the same file is a normal (if large) image.
    assert probe(str(path), 64_000_000) == SourceImage(8000, 8000, False)


def test_what_is_not_an_image(tmp_path):
    path = tmp_path / "text"
    path.write_bytes(b"hello, not a picture")
    with pytest.raises(NotAnImage):
        probe(str(path), 1_000_000)
    svg = tmp_path / "svg"
    svg.write_bytes(b'<svg xmlns="http://www.w3.org/2000/svg"/>')
    with pytest.raises(NotAnImage):
        probe(str(svg), 1_000_000)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(solid(300, 300, "PNG")[:200])
    with pytest.raises(NotAnImage):
        render(str(truncated), [ThumbnailKey(32, 32, "crop", "image/png", False)], 1_000_000)
