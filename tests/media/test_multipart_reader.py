"""MultipartMediaReader: federation media responses read as they stream in, chunk by chunk."""

import os

import pytest

from homeserver.federation.errors import MalformedResponse
from homeserver.media.multipart import MAX_JSON_PART_BYTES, MultipartMediaReader, upload_name_from
from tests.peers.honest import multipart_media
from tests.peers.liar import MALFORMED_MEDIA


def chunked(body: bytes, size: int):
    return (body[i : i + size] for i in range(0, len(body), size))


@pytest.mark.parametrize("chunk_size", [1, 7, 4096, 10**7])
def test_file_part_whatever_the_chunking(chunk_size):
    data = os.urandom(20_000) + b"\r\n--b\r\n-B\r\n--C--\r\n"  # near-boundaries inside
    body, content_type = multipart_media(
        {
            "Content-Type": "image/png",
            "Content-Disposition": "inline; filename*=utf-8''caf%C3%A9.png",
        },
        data,
        boundary="B",
    )
    reader = MultipartMediaReader("peer.test", content_type, chunked(body, chunk_size))
    part = reader.file_part()
    assert (part.content_type, part.upload_name, part.location) == ("image/png", "café.png", None)
    received = list(reader.file_chunks())
    assert b"".join(received) == data
    if chunk_size < len(data):
        assert len(received) > 1  # handed on as it arrives, not gathered first


def test_file_part_is_read_only_as_far_as_its_headers():
    body, content_type = multipart_media({"Content-Type": "text/plain"}, b"x" * 100_000)
    pulled = []

    def source():
        for chunk in chunked(body, 1000):
            pulled.append(chunk)
            yield chunk

    reader = MultipartMediaReader("peer.test", content_type, source())
    reader.file_part()
    assert len(pulled) == 1  # the rest is still on the wire


def test_location_part():
    body, content_type = multipart_media({"Location": "https://cdn.example/a?b=c"})
    part = MultipartMediaReader("peer.test", content_type, iter([body])).file_part()
    assert part.location == "https://cdn.example/a?b=c"


@pytest.mark.parametrize("kind", sorted(MALFORMED_MEDIA))
def test_malformed_bodies(kind):
    body, content_type = MALFORMED_MEDIA[kind]
    with pytest.raises(MalformedResponse):
        reader = MultipartMediaReader("peer.test", content_type, chunked(body, 5))
        reader.file_part()
        b"".join(reader.file_chunks())


def test_oversized_metadata_part():
    body = (
        b'\r\n--B\r\nContent-Type: application/json\r\n\r\n{"pad": "'
        + b"x" * MAX_JSON_PART_BYTES
        + b'"}\r\n--B\r\n\r\nx\r\n--B--\r\n'
    )
    with pytest.raises(MalformedResponse):
        MultipartMediaReader(
            "peer.test", "multipart/mixed; boundary=B", chunked(body, 4096)
        ).file_part()


@pytest.mark.parametrize(
    "header, name",
    [
        (None, None),
        ("inline", None),
        ("inline; filename=cat.png", "cat.png"),
        ('attachment; filename="a b.pdf"', "a b.pdf"),
        ("attachment; filename*=utf-8''R%C3%A9sum%C3%A9.pdf; filename=Resume.pdf", "Résumé.pdf"),
        ("attachment; filename*=no-such-charset''%41bc", None),
        ("attachment; filename*=utf-8''%FF%FE; filename=plain.txt", "plain.txt"),
        ("inline; FILENAME*=UTF-8'en'a%20b.txt", "a b.txt"),
    ],
)
def test_upload_name_from(header, name):
    assert upload_name_from(header) == name
