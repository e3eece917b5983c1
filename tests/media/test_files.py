"""MediaFileStore on a real directory: paths, and storing whole or not at all."""

import hashlib
import os

import gevent
import pytest
from gevent.event import Event

from homeserver.media.files import (
    FileTooLarge,
    MediaFileStore,
    ThumbnailKey,
    is_valid_media_id,
    new_media_id,
)


@pytest.fixture
def files(tmp_path):
    return MediaFileStore(str(tmp_path / "media"), "weir.test")


def all_files(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names
    )


def test_media_ids():
    ids = {new_media_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(is_valid_media_id(i) and len(i) == 24 for i in ids)
    for bad in [
        "",
        "..",
        "../x",
        "a/b",
        "a.b",
        "a%2Fb",
        "ä",
        "a b",
        "x" * 256,
        "a\x00",
        "abc\n",
        "\nabc",
    ]:
        assert not is_valid_media_id(bad), bad


def test_paths_come_from_the_id_only(files, tmp_path):
    root = str(tmp_path / "media")
    shard = hashlib.sha256(b"abcdefgh").hexdigest()
    media_dir = f"{root}/local/{shard[:2]}/{shard[2:4]}/abcdefgh"
    assert files.original_path("weir.test", "abcdefgh") == f"{media_dir}/original"
    key = ThumbnailKey(96, 96, "crop", "image/png", False)
    assert (
        files.thumbnail_path("weir.test", "abcdefgh", key)
        == f"{media_dir}/thumbnails/96x96-crop.png"
    )
    # Short ids get directories of their own like any other.
    assert files.original_path("weir.test", "a") != files.original_path("weir.test", "a_")
    # A remote origin names its folder only through a hash, even a hostile one.
    remote = files.original_path("../../etc", "abcdefgh")
    assert remote.startswith(f"{root}/remote/") and "etc" not in remote
    for bad in ["..", "../../etc/passwd", "a/b", ""]:
        with pytest.raises(ValueError):
            files.original_path("weir.test", bad)


def test_store_file_streams_hashes_and_records(files, tmp_path):
    path = files.original_path("weir.test", "abcdefgh")
    recorded = []
    stored = files.store_file(path, iter([b"hello ", b"world"]), 100, recorded.append)
    assert stored.length == 11 and stored.sha256 == hashlib.sha256(b"hello world").hexdigest()
    assert recorded == [stored]
    assert open(path, "rb").read() == b"hello world"
    assert os.listdir(files.temp_dir) == []


def test_over_the_cap_nothing_is_left(files, tmp_path):
    path = files.original_path("weir.test", "abcdefgh")
    recorded = []
    with pytest.raises(FileTooLarge):
        files.store_file(path, iter([b"x" * 60, b"x" * 60]), 100, recorded.append)
    assert recorded == []
    assert all_files(tmp_path / "media") == []


def test_a_failing_source_leaves_nothing(files, tmp_path):
    def body():
        yield b"partial"
        raise OSError("client went away")

    with pytest.raises(OSError):
        files.store_file(files.original_path("weir.test", "abcdefgh"), body(), 100, print)
    assert all_files(tmp_path / "media") == []


def test_a_killed_upload_leaves_nothing(files, tmp_path):
    started = Event()

    def body():
        yield b"partial"
        started.set()
        Event().wait()  # a client that stops sending

    worker = gevent.spawn(
        files.store_file, files.original_path("weir.test", "abcdefgh"), body(), 100, print
    )
    started.wait()
    worker.kill()  # GreenletExit, as when the server stops the request
    assert all_files(tmp_path / "media") == []


def test_an_existing_copy_is_never_displaced(files):
    path = files.original_path("weir.test", "abcdefgh")
    files.store_file(path, [b"first"], 100, lambda s: None)
    reader = open(path, "rb")
    recorded = []
    files.store_file(path, [b"second"], 100, recorded.append)
    assert reader.read() == b"first" and open(path, "rb").read() == b"first"
    assert len(recorded) == 1  # the row is still offered: "insert if absent" is the caller's
    assert os.listdir(files.temp_dir) == []


def test_stale_temp_files_are_removed_at_start(tmp_path):
    files = MediaFileStore(str(tmp_path / "media"), "weir.test")
    stale = os.path.join(files.temp_dir, "upload-stale")
    fresh = os.path.join(files.temp_dir, "upload-fresh")
    for name in (stale, fresh):
        open(name, "wb").close()
    os.utime(stale, (0, 0))
    MediaFileStore(str(tmp_path / "media"), "weir.test")
    assert os.listdir(files.temp_dir) == ["upload-fresh"]
