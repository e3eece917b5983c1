"""The server ACL's matching rules (rooms/server_acl.py), as the spec gives them."""

import pytest

from homeserver.rooms.server_acl import ServerAcl


@pytest.mark.parametrize(
    "content,server,allowed",
    [
        ({"allow": ["*"]}, "example.org", True),
        ({}, "example.org", False),  # no allow list: nobody
        ({"allow": "*"}, "example.org", False),  # not a list: none
        ({"allow": ["*"], "deny": ["evil.org"]}, "evil.org", False),
        ({"allow": ["*"], "deny": ["evil.org"]}, "evil.org:8448", False),  # port ignored
        ({"allow": ["*"], "deny": ["*.evil.org"]}, "a.evil.org", False),
        ({"allow": ["*"], "deny": ["*.evil.org"]}, "evil.org", True),
        ({"allow": ["*"], "deny": ["EVIL.org"]}, "evil.ORG", False),  # case does not matter
        ({"allow": ["ex?mple.org"]}, "example.org", True),
        ({"allow": ["ex?mple.org"]}, "exaample.org", False),
        ({"allow": ["example.org"]}, "example.org.evil", False),  # the whole name
        ({"allow": ["exam.le.org"]}, "examXle.org", False),  # . is no wildcard
        ({"allow": ["*"]}, "1.2.3.4:8448", True),
        ({"allow": ["*"], "allow_ip_literals": False}, "1.2.3.4:8448", False),
        ({"allow": ["*"], "allow_ip_literals": False}, "[::1]:8448", False),
        ({"allow": ["*"], "allow_ip_literals": "no"}, "1.2.3.4", True),  # only false denies
        ({"allow": ["[::1]"]}, "[::1]:8448", True),
        ({"allow": ["*", 7], "deny": [None]}, "example.org", True),  # non-strings ignored
        ({"allow": ["*"]}, "bad name!", False),
    ],
)
def test_matching(content, server, allowed):
    assert ServerAcl(content).allows(server) is allowed
