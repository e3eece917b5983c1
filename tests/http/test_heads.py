"""Request heads read without the email parser give what it gives (homeserver/http/heads.py)."""

import http.client
import io

import pytest
from gevent.pywsgi import OldMessage

from homeserver.http.heads import read_head

HEADS = [
    b"Host: a\r\nAuthorization: Bearer x\r\nContent-Length: 3\r\n\r\n",
    b"Host: a\r\nX-Empty:\r\nX-Spaces:   padded  \r\n\r\n",
    b"Host: a\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",  # repeated
    b"Host: a\nAccept: */*\n\n",  # bare LF
    b"Host: a\r\nX-Latin: caf\xe9\r\n\r\n",
    b"Host: a\r\nX-Folded: one\r\n two\r\n\r\n",  # obsolete folding: the email parser's
    b"Host: a\r\nno colon here\r\nX-After: 1\r\n\r\n",
    b"Host: a\r\nBad Name: x\r\nX-After: 1\r\n\r\n",
    b"Host: a\r\nX-CR: a\rb\r\n\r\n",
    b"From nobody\r\nHost: a\r\n\r\n",
    b"Host: a\r\n",  # the connection ended before the blank line
    b"\r\n",
]


def fields(message) -> tuple:
    return list(message.items()), message.status, list(message.headers)


@pytest.mark.parametrize("head", HEADS)
def test_a_head_reads_as_the_email_parser_reads_it(head):
    expected = http.client.parse_headers(io.BytesIO(head), _class=OldMessage)
    assert fields(read_head(io.BytesIO(head))) == fields(expected)


def test_limits_are_http_clients():
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n"
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        read_head(io.BytesIO(many))
    long_line = b"X-Long: " + b"a" * 70000 + b"\r\n\r\n"
    assert read_head(io.BytesIO(long_line)).status == "Line too long"
