"""The response builders: header rules, and the federation multipart body read back by
python-multipart, the parser Synapse uses."""

import pytest

from homeserver.api.media_responses import (
    CACHE_CONTROL,
    CONTENT_SECURITY_POLICY,
    content_disposition,
    multipart_response,
    served_content_type,
)
from homeserver.media.files import MediaFile
from tests.support.multipart import media_file_part


@pytest.mark.parametrize(
    "content_type, filename, expected",
    [
        ("image/png", None, "inline"),
        ("image/png", "cat.png", "inline; filename=cat.png"),
        ("IMAGE/PNG; foo=bar", "cat.png", "inline; filename=cat.png"),
        ("text/html", "page.html", "attachment; filename=page.html"),
        ("image/svg+xml", "x.svg", "attachment; filename=x.svg"),
        (
            "application/pdf",
            "War and Peace.pdf",
            "attachment; filename*=utf-8''War%20and%20Peace.pdf",
        ),
        ("text/plain", "naïve €.txt", "inline; filename*=utf-8''na%C3%AFve%20%E2%82%AC.txt"),
        ("text/plain", 'a"b;c\r\nd', "inline; filename*=utf-8''a%22b%3Bc%0D%0Ad"),
        ("text/plain", "a.txt\n", "inline; filename*=utf-8''a.txt%0A"),
        (None, "x", "attachment; filename=x"),
    ],
)
def test_content_disposition(content_type, filename, expected):
    assert content_disposition(content_type, filename) == expected


@pytest.mark.parametrize(
    "stored, served",
    [
        ("text/plain", "text/plain; charset=utf-8"),
        ("text/plain; charset=latin-1", "text/plain; charset=latin-1"),
        ("image/png", "image/png"),
        (None, "application/octet-stream"),
        ("image/png\r\nSet-Cookie: x=1", "application/octet-stream"),
        ("image/png\n", "application/octet-stream"),
        ("imäge/png", "application/octet-stream"),
    ],
)
def test_served_content_type(stored, served):
    assert served_content_type(stored) == served


def body_of(response) -> bytes:
    try:
        return b"".join(response.response)
    finally:
        response.close()


def test_multipart_shape_is_synapses(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"hello")
    response = multipart_response(MediaFile(str(path), "text/plain", "hello.txt"))
    content_type = response.headers["Content-Type"]
    assert content_type.startswith("multipart/mixed; boundary=")
    boundary = content_type.split("boundary=")[1]
    body = body_of(response)
    assert (
        body
        == (
            f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n{{}}"
            f"\r\n--{boundary}\r\nContent-Type: text/plain\r\n"
            f"Content-Disposition: inline; filename=hello.txt\r\n\r\nhello"
            f"\r\n--{boundary}--\r\n"
        ).encode()
    )
    assert int(response.headers["Content-Length"]) == len(body)


def test_multipart_parses_with_python_multipart(tmp_path):
    data = bytes(range(256)) * 1000 + b"\r\n--not-the-boundary--\r\n"  # binary, CRLFs included
    path = tmp_path / "file"
    path.write_bytes(data)
    response = multipart_response(MediaFile(str(path), "application/pdf", "Résumé final.pdf"))
    body = body_of(response)
    assert int(response.headers["Content-Length"]) == len(body)
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["Cache-Control"] == CACHE_CONTROL
    file_headers, file_data = media_file_part(response.headers["Content-Type"], body)
    assert file_headers == {
        "content-type": "application/pdf",
        "content-disposition": "attachment; filename*=utf-8''R%C3%A9sum%C3%A9%20final.pdf",
    }
    assert file_data == data


def test_multipart_of_a_missing_file_is_not_found(tmp_path):
    from homeserver.core.errors import MatrixError

    with pytest.raises(MatrixError) as info:
        multipart_response(MediaFile(str(tmp_path / "gone"), "text/plain", None))
    assert (info.value.status, info.value.errcode) == (404, "M_NOT_FOUND")


def test_multipart_body_closes_its_file_even_if_never_read(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"x")
    response = multipart_response(MediaFile(str(path), "text/plain", None))
    response.close()  # the client left before the first byte
    assert response.response._file.closed
