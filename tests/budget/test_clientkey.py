"""client_key: who a request is counted against."""

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget import client_key, parse_networks

PROXIES = parse_networks(["10.0.0.0/8", "192.168.1.1", "2001:db8:ffff::/48"])

CASES = [
    # (id, remote_addr, X-Forwarded-For, trusted, ipv6_prefix, expected)
    ("ipv4", "203.0.113.7", None, (), 64, "203.0.113.7"),
    ("ipv4 with port", "203.0.113.7:51234", None, (), 64, "203.0.113.7"),
    ("ipv6 grouped by /64", "2001:db8:1:2::5", None, (), 64, "2001:db8:1:2::/64"),
    ("ipv6 same /64, other host", "2001:db8:1:2:ffff:1:2:3", None, (), 64, "2001:db8:1:2::/64"),
    ("ipv6 other /64", "2001:db8:1:3::5", None, (), 64, "2001:db8:1:3::/64"),
    ("ipv6 bracketed with port", "[2001:db8:1:2::5]:8448", None, (), 64, "2001:db8:1:2::/64"),
    ("ipv6 zone id", "fe80::1%eth0", None, (), 64, "fe80::/64"),
    ("ipv6 custom /48", "2001:db8:1:2::5", None, (), 48, "2001:db8:1::/48"),
    ("ipv6 custom /128", "2001:db8:1:2::5", None, (), 128, "2001:db8:1:2::5/128"),
    ("ipv6 custom /56", "2001:db8:1:2ff::5", None, (), 56, "2001:db8:1:200::/56"),
    ("ipv4-mapped ipv6", "::ffff:198.51.100.9", None, (), 64, "198.51.100.9"),
    ("ipv4-mapped bracketed", "[::ffff:198.51.100.9]:443", None, (), 64, "198.51.100.9"),
    ("whitespace", "  203.0.113.7 ", None, (), 64, "203.0.113.7"),
    # Untrusted peer: the header is the client's own claim, ignored.
    ("spoof from untrusted peer", "203.0.113.7", "1.1.1.1", PROXIES, 64, "203.0.113.7"),
    ("spoof, no proxies configured", "10.0.0.1", "1.1.1.1", (), 64, "10.0.0.1"),
    ("spoof from untrusted v6 peer", "2001:db8:1::1", "1.1.1.1", PROXIES, 64, "2001:db8:1::/64"),
    # Trusted peer: first untrusted hop from the right.
    ("one trusted proxy", "10.0.0.1", "198.51.100.9", PROXIES, 64, "198.51.100.9"),
    (
        "chain of trusted proxies",
        "10.0.0.1",
        "198.51.100.9, 10.1.1.1, 192.168.1.1",
        PROXIES,
        64,
        "198.51.100.9",
    ),
    (
        "forged left part ignored",
        "10.0.0.1",
        "6.6.6.6, 198.51.100.9, 10.2.2.2",
        PROXIES,
        64,
        "198.51.100.9",
    ),
    ("all hops trusted: leftmost", "10.0.0.1", "10.9.9.9, 10.1.1.1", PROXIES, 64, "10.9.9.9"),
    ("ipv6 client behind proxy", "10.0.0.1", "2001:db8:5:6::7", PROXIES, 64, "2001:db8:5:6::/64"),
    ("ipv6 trusted proxy", "2001:db8:ffff::1", "203.0.113.7", PROXIES, 64, "203.0.113.7"),
    ("mapped trusted peer", "::ffff:10.0.0.1", "203.0.113.7", PROXIES, 64, "203.0.113.7"),
    ("mapped hop", "10.0.0.1", "::ffff:203.0.113.7", PROXIES, 64, "203.0.113.7"),
    ("hop with port", "10.0.0.1", "203.0.113.7:4711", PROXIES, 64, "203.0.113.7"),
    (
        "hop bracketed v6 with port",
        "10.0.0.1",
        "[2001:db8:5:6::7]:4711",
        PROXIES,
        64,
        "2001:db8:5:6::/64",
    ),
    ("hop bracketed v6", "10.0.0.1", " [2001:db8:5:6::7] ", PROXIES, 64, "2001:db8:5:6::/64"),
    ("hop v6 zone", "10.0.0.1", "fe80::1%25eth0, fe80::2%eth0", PROXIES, 64, "fe80::/64"),
    ("hop custom prefix", "10.0.0.1", "2001:db8:5:6::7", PROXIES, 32, "2001:db8::/32"),
    (
        "several headers joined",
        "10.0.0.1",
        "198.51.100.9, 10.1.1.1, 203.0.113.7, 10.2.2.2",
        PROXIES,
        64,
        "203.0.113.7",
    ),
    (
        "empty list elements skipped",
        "10.0.0.1",
        "198.51.100.9, , 10.1.1.1,",
        PROXIES,
        64,
        "198.51.100.9",
    ),
    # Junk: never believed, the peer is used.
    ("empty header", "10.0.0.1", "", PROXIES, 64, "10.0.0.1"),
    ("only commas", "10.0.0.1", ",,,", PROXIES, 64, "10.0.0.1"),
    ("garbage", "10.0.0.1", "garbage", PROXIES, 64, "10.0.0.1"),
    ("unknown", "10.0.0.1", "unknown", PROXIES, 64, "10.0.0.1"),
    ("garbage on the right", "10.0.0.1", "1.2.3.4, garbage", PROXIES, 64, "10.0.0.1"),
    ("garbage behind a trusted hop", "10.0.0.1", "garbage, 10.1.1.1", PROXIES, 64, "10.0.0.1"),
    ("garbage left of the client", "10.0.0.1", "garbage, 1.2.3.4", PROXIES, 64, "1.2.3.4"),
    ("bad port", "10.0.0.1", "1.2.3.4:http", PROXIES, 64, "10.0.0.1"),
    ("unclosed bracket", "10.0.0.1", "[2001:db8::1", PROXIES, 64, "10.0.0.1"),
    ("junk after bracket", "10.0.0.1", "[2001:db8::1]x", PROXIES, 64, "10.0.0.1"),
    ("obfuscated identifier", "10.0.0.1", "_hidden", PROXIES, 64, "10.0.0.1"),
    ("leading zeros", "10.0.0.1", "01.2.3.4", PROXIES, 64, "10.0.0.1"),
    ("hostname", "10.0.0.1", "example.org", PROXIES, 64, "10.0.0.1"),
    # Unparseable peer: returned as is, stripped.
    ("unix socket", "/run/weir.sock ", "1.2.3.4", PROXIES, 64, "/run/weir.sock"),
    ("empty peer", "", "1.2.3.4", PROXIES, 64, ""),
    # Strings are accepted in place of parsed networks.
    ("string proxies", "10.0.0.1", "198.51.100.9", ["10.0.0.0/8"], 64, "198.51.100.9"),
    (
        "network proxies list",
        "10.0.0.1",
        "198.51.100.9",
        [ipaddress.ip_network("10.0.0.0/8")],
        64,
        "198.51.100.9",
    ),
]


@pytest.mark.parametrize(
    "remote_addr, forwarded_for, trusted, prefix, expected",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_client_key(remote_addr, forwarded_for, trusted, prefix, expected):
    assert client_key(remote_addr, forwarded_for, trusted, ipv6_prefix=prefix) == expected


def test_two_addresses_in_one_slash64_share_a_key_and_other_64s_do_not():
    a = client_key("2001:db8:aaaa:1::1", None, ())
    b = client_key("2001:db8:aaaa:1:dead:beef:0:1", None, ())
    c = client_key("2001:db8:aaaa:2::1", None, ())
    assert a == b != c


def test_parse_networks():
    nets = parse_networks(
        ["10.1.2.3/8", " 192.168.0.1 ", "2001:db8::/32", ipaddress.ip_network("fd00::/8")]
    )
    assert [str(n) for n in nets] == ["10.0.0.0/8", "192.168.0.1/32", "2001:db8::/32", "fd00::/8"]
    assert parse_networks([]) == ()
    assert parse_networks("10.0.0.0/8") == (ipaddress.ip_network("10.0.0.0/8"),)


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "nonsense", "", "1.2.3.4/8/8"])
def test_parse_networks_names_the_bad_entry(bad):
    with pytest.raises(ValueError, match="not an IP network"):
        parse_networks(["10.0.0.0/8", bad])


def test_ipv6_prefix_is_validated():
    with pytest.raises(ValueError):
        client_key("2001:db8::1", None, (), ipv6_prefix=129)


@settings(max_examples=300, deadline=None)
@given(ip=st.integers(0, 2**128 - 1), prefix=st.integers(0, 128))
def test_ipv6_key_is_the_cidr_of_its_network(ip, prefix):
    addr = ipaddress.IPv6Address(ip)
    if addr.ipv4_mapped is not None:
        expected = str(addr.ipv4_mapped)
    else:
        expected = str(ipaddress.IPv6Network((addr, prefix), strict=False))
    assert client_key(str(addr), None, (), ipv6_prefix=prefix) == expected
    assert client_key(addr.exploded, None, (), ipv6_prefix=prefix) == expected
