"""The server-name grammar: one definition, used to validate input and to split names for
discovery, so a name that passes validation never fails later, after a slot was taken."""

import pytest

from homeserver.core.identifiers import (
    create_event_id_for_room,
    is_hash_room_id,
    is_valid_room_id,
    is_valid_server_name,
    room_id_for_create_event,
    room_id_server,
)
from homeserver.federation.discovery import split_server_name

NAMES = [
    "example.org",
    "example.org:8448",
    "1.2.3.4:80",
    "[2001:db8::1]:8448",
    "[::1]",
    "host:1",
    "host:65535",
    "",
    "a b",
    "host:",
    "host:port",
    "host:0",
    "host:65536",
    "host:99999",
    "host:٣",
    "[::1",
    "[not-ip]:1",
    "host:1:2",
    "[::1]x",
    "[fe80::1%eth0]",
]


@pytest.mark.parametrize("name", NAMES)
def test_validation_and_splitting_agree(name):
    try:
        split_server_name(name)
        splits = True
    except ValueError:
        splits = False
    assert is_valid_server_name(name) == splits


@pytest.mark.parametrize("name", ["host:0", "host:65536", "host:99999"])
def test_ports_outside_the_tcp_range_are_invalid(name):
    assert not is_valid_server_name(name)


@pytest.mark.parametrize("name", ["example.org\n", "1.2.3.4\n"])
def test_a_final_newline_is_not_part_of_a_server_name(name):
    # Identifier grammar: a server name has no whitespace; a pattern ending in `$` would
    # accept one final "\n", which would then reach DNS and the Host header.
    assert not is_valid_server_name(name)


@pytest.mark.parametrize(
    "room_id, server",
    [
        ("!abc:example.org", "example.org"),
        ("!abc:example.org:8448", "example.org:8448"),
        ("!" + "Nhcu5BS-UMnFX7hBVfVSoXiD7OgH6iRT-xyIuqDnpYQ", None),  # v12: the spec's example
    ],
)
def test_room_ids_of_every_version_are_valid_and_only_old_ones_name_a_server(room_id, server):
    assert is_valid_room_id(room_id)
    assert room_id_server(room_id) == server
    assert is_hash_room_id(room_id) == (server is None)


@pytest.mark.parametrize(
    "room_id", ["!", "!short", "!" + "A" * 44, "!" + "A" * 42 + "=", "!" + "A" * 43 + "\n", "!:hs"]
)
def test_malformed_room_ids_are_invalid(room_id):
    assert not is_valid_room_id(room_id)


def test_a_v12_room_id_and_its_create_event_id_map_to_each_other():
    event_id = "$Nhcu5BS-UMnFX7hBVfVSoXiD7OgH6iRT-xyIuqDnpYQ"
    room_id = room_id_for_create_event(event_id)
    assert room_id == "!Nhcu5BS-UMnFX7hBVfVSoXiD7OgH6iRT-xyIuqDnpYQ"
    assert create_event_id_for_room(room_id) == event_id


@pytest.mark.parametrize("name", ["..", ".", "a..b", ".a", "a.", "a..b:8448", "..:80"])
def test_an_empty_label_is_no_server_name(name):
    assert not is_valid_server_name(name)


@pytest.mark.parametrize("name", ["a", "a.b", "a-b.c:8448", "1.2.3.4", "[::1]:80"])
def test_names_with_every_label_are_server_names(name):
    assert is_valid_server_name(name)
