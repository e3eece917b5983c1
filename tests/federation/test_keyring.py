"""The keyring: cache, verification, coalescing and the key-resolution budget, against real
peers and a real database."""

import time

import gevent
import pytest
from signedjson.key import encode_verify_key_base64, generate_signing_key, get_verify_key
from signedjson.sign import sign_json

from budget import InFlightBudget, OutboundDeadline, RateLimiter
from homeserver.config import TrustedKeyServer
from homeserver.federation.errors import InvalidSignature, KeyResolutionRefused
from homeserver.federation.keyring import MAX_NOTARY_QUERY_SERVERS, Keyring
from homeserver.metrics import Metrics
from homeserver.storage.database import open_database
from homeserver.storage.keys import ServerKeyStore, StoredKey
from homeserver.storage.migrations import migrate
from tests.peers.liar import LiarPeer
from tests.peers.origins import FakeOrigin
from tests.peers.tarpit import Tarpit
from tests.support.federation import make_client

KEYS = "/_matrix/key/v2/server"
OUR_KEY = generate_signing_key("ours")


def now_ms():
    return int(time.time() * 1000)


@pytest.fixture
def store(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/keys.db")
    migrate(db)
    yield ServerKeyStore(db)
    db.close()


@pytest.fixture
def make_keyring(test_ca, dns, store):
    clients = []

    def make(max_in_flight=16, rate=(30, 60), trusted=(), remote_timeout=10.0, metrics=None):
        client = make_client(test_ca, dns, signing_key=OUR_KEY, remote_timeout=remote_timeout)
        clients.append(client)
        return Keyring(
            "weir.test",
            OUR_KEY,
            store,
            client,
            InFlightBudget(max_in_flight, None, name="key_resolution"),
            RateLimiter(*rate),
            trusted,
            remote_timeout,
            metrics=metrics,
        )

    yield make
    for client in clients:
        client.close()


def test_store_round_trip_on_both_engines(database_url):
    db = open_database(database_url)
    try:
        migrate(db)
        store = ServerKeyStore(db)
        store.store_document(
            "s.test",
            '{"v":1}',
            2000,
            [
                StoredKey("ed25519:a", "AAAA", 2000, None),
                StoredKey("ed25519:old", "BBBB", 500, 500),
            ],
            now_ms=100,
        )
        # An older document does not replace the newer one; an expiry always counts.
        store.store_document(
            "s.test", '{"v":0}', 1000, [StoredKey("ed25519:a", "AAAA", 1000, None)], 200
        )
        assert store.get_document("s.test").key_json == '{"v":1}'
        assert store.get_keys("s.test")["ed25519:a"].valid_until_ts == 2000
        store.store_document(
            "s.test", '{"v":2}', 3000, [StoredKey("ed25519:a", "AAAA", 900, 900)], 300
        )
        keys = store.get_keys("s.test")
        assert keys["ed25519:a"].expired_ts == 900 and keys["ed25519:old"].expired_ts == 500
        assert store.get_document("nobody.test") is None
    finally:
        db.close()


def test_a_servers_stored_keys_are_read_once_for_many_events(make_keyring, store):
    """A big room's state: thousands of events signed with one key are one database read
    (keyring.py, STORED_KEYS_MEMO_SECONDS); a key stored after that read is still found in
    the database, with no fetch."""
    verify = encode_verify_key_base64(get_verify_key(generate_signing_key("a")))
    far = now_ms() + 3_600_000
    store.store_document("s.test", "{}", far, [StoredKey("ed25519:a", verify, far, None)], 0)
    reads = []
    get_keys = store.get_keys
    store.get_keys = lambda name: reads.append(name) or get_keys(name)
    keyring = make_keyring()
    for _ in range(1000):
        assert list(keyring.resolve("s.test", ["ed25519:a"], now_ms(), None)) == ["ed25519:a"]
    assert reads == ["s.test"]
    store.store_document("s.test", "{}", far, [StoredKey("ed25519:b", verify, far, None)], 0)
    assert list(keyring.resolve("s.test", ["ed25519:b"], now_ms(), None)) == ["ed25519:b"]
    assert keyring.network_fetches == 0 and len(reads) == 2


def test_cache_hits_make_no_network_calls(make_keyring, start_peer):
    peer = start_peer("127.25.1.1:8448", "127.25.1.1", 8448)
    keyring = make_keyring()
    found = keyring.resolve(peer.server_name, [peer.key_id], now_ms(), "192.0.2.1")
    assert list(found) == [peer.key_id]
    for _ in range(3):
        assert list(keyring.resolve(peer.server_name, [peer.key_id], now_ms(), "192.0.2.1")) == [
            peer.key_id
        ]
    assert peer.hits(KEYS) == 1 and keyring.network_fetches == 1
    # Our own keys never touch the network or the database.
    assert list(keyring.resolve("weir.test", ["ed25519:ours"], now_ms(), None)) == ["ed25519:ours"]


def test_verify_json_with_fetched_key(make_keyring, start_peer):
    peer = start_peer("127.25.1.2:8448", "127.25.1.2", 8448)
    keyring = make_keyring()
    signed = sign_json({"a": 1}, peer.server_name, peer.signing_key)
    assert keyring.verify_json(signed, peer.server_name, "192.0.2.1") == peer.key_id
    with pytest.raises(InvalidSignature):
        keyring.verify_json(dict(signed, a=2), peer.server_name, "192.0.2.1")
    with pytest.raises(InvalidSignature):
        keyring.verify_json({"a": 1}, peer.server_name, "192.0.2.1")


def test_concurrent_resolutions_make_one_fetch(make_keyring, start_peer):
    peer = start_peer("127.25.2.1:8448", "127.25.2.1", 8448, latency=0.3)
    keyring = make_keyring()
    jobs = [
        gevent.spawn(keyring.resolve, peer.server_name, [peer.key_id], now_ms(), f"192.0.2.{i}")
        for i in range(20)
    ]
    gevent.joinall(jobs, raise_error=True)
    assert all(list(job.value) == [peer.key_id] for job in jobs)
    assert peer.hits(KEYS) == 1 and keyring.network_fetches == 1
    assert keyring.budget.in_flight == 0


def test_tarpit_key_server_holds_at_most_the_in_flight_limit(make_keyring, dns):
    with Tarpit("127.25.3.1", 8448) as tarpit:
        for i in range(6):
            dns.add_a(f"tar{i}.test", "127.25.3.1")
        keyring = make_keyring(max_in_flight=2, remote_timeout=1.0)
        jobs = [
            gevent.spawn(
                keyring.resolve, f"tar{i}.test:8448", ["ed25519:x"], now_ms(), f"192.0.2.{i}"
            )
            for i in range(6)
        ]
        gevent.joinall(jobs)
        refused = [j for j in jobs if isinstance(j.exception, KeyResolutionRefused)]
        assert len(refused) == 4 and all(j.exception.retry_after_ms > 0 for j in refused)
        assert [j.value for j in jobs if j.successful()] == [{}, {}]
        assert tarpit.wait_accepted(2, timeout=5)
        assert tarpit.max_concurrent <= 2 and tarpit.accepted == 2
        assert tarpit.wait_current(0, timeout=5)
        assert keyring.budget.in_flight == 0


def test_metrics_count_cache_hits_shared_fetches_and_expiries(make_keyring, start_peer, dns):
    metrics = Metrics()

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels) or 0

    peer = start_peer("127.25.3.2:8448", "127.25.3.2", 8448)
    keyring = make_keyring(remote_timeout=1.0, metrics=metrics)
    for _ in range(2):
        keyring.resolve(peer.server_name, [peer.key_id], now_ms(), "192.0.2.1")
    assert sample("weir_cache_misses_total", cache="server_keys") == 1
    assert sample("weir_cache_hits_total", cache="server_keys") == 1

    with Tarpit("127.25.3.3", 8448) as tarpit:
        dns.add_a("slow-keys.test", "127.25.3.3")
        jobs = [
            gevent.spawn(
                keyring.resolve, "slow-keys.test:8448", ["ed25519:x"], now_ms(), "192.0.2.2"
            )
            for _ in range(3)
        ]
        gevent.joinall(jobs, raise_error=True)
        assert tarpit.accepted == 1  # one fetch, shared by the other two
    assert sample("weir_coalesced_waits_total", call="key_fetch") == 2
    assert sample("weir_outbound_deadline_expiries_total", call="key_fetch") == 1
    assert sample("weir_cache_misses_total", cache="server_keys") == 4


def test_per_ip_rate_limit(make_keyring, start_peer):
    peers = [start_peer(f"127.25.4.{i}:8448", f"127.25.4.{i}", 8448) for i in (1, 2, 3)]
    keyring = make_keyring(rate=(2, 60))
    for peer in peers[:2]:
        keyring.resolve(peer.server_name, [peer.key_id], now_ms(), "198.51.100.7")
    with pytest.raises(KeyResolutionRefused) as e:
        keyring.resolve(peers[2].server_name, [peers[2].key_id], now_ms(), "198.51.100.7")
    assert e.value.retry_after_ms > 0
    assert peers[2].hits(KEYS) == 0
    # Another source address has its own allowance; cached keys need none.
    assert keyring.resolve(peers[2].server_name, [peers[2].key_id], now_ms(), "198.51.100.8")
    assert keyring.resolve(peers[0].server_name, [peers[0].key_id], now_ms(), "198.51.100.7")


def test_old_verify_keys_are_stored_with_expired_ts(make_keyring, start_peer, store):
    peer = start_peer("127.25.5.1:8448", "127.25.5.1", 8448)
    old = generate_signing_key("old")
    expired = now_ms() - 1000
    peer.old_verify_keys = {
        "ed25519:old": {"key": encode_verify_key_base64(get_verify_key(old)), "expired_ts": expired}
    }
    keyring = make_keyring()
    assert keyring.resolve(peer.server_name, ["ed25519:old"], now_ms(), "192.0.2.1") == {}
    assert store.get_keys(peer.server_name)["ed25519:old"].expired_ts == expired
    # Valid for what it signed before it expired; not for now, and not fetched again.
    assert keyring.resolve(peer.server_name, ["ed25519:old"], expired - 10, "192.0.2.1")
    assert keyring.resolve(peer.server_name, ["ed25519:old"], now_ms(), "192.0.2.1") == {}
    assert peer.hits(KEYS) == 1


def test_wrong_self_signature_is_refused(make_keyring, start_peer, store):
    liar = start_peer("127.25.6.1:8448", "127.25.6.1", 8448, cls=LiarPeer)
    liar.wrong_key_signature()
    keyring = make_keyring()
    assert keyring.resolve(liar.server_name, [liar.key_id], now_ms(), "192.0.2.1") == {}
    assert store.get_keys(liar.server_name) == {}


def _notary(start_peer, ip, origin):
    """A notary peer that answers /_matrix/key/v2/query with ``origin``'s document, signed
    by itself too."""
    notary = start_peer(f"{ip}:8448", ip, 8448)

    def query(req):
        doc = sign_json(origin.key_document(), notary.server_name, notary.signing_key)
        return 200, {"server_keys": [doc]}

    notary.route("POST", "/_matrix/key/v2/query", query)
    return notary


def test_notary_fallback_when_origin_is_unreachable(make_keyring, start_peer):
    # The origin's listener is stopped: only the notary can vouch for its key.
    origin = start_peer("127.25.7.1:8448", "127.25.7.1", 8448)
    origin.stop()
    notary = _notary(start_peer, "127.25.7.2", origin)
    keyring = make_keyring(trusted=(TrustedKeyServer(notary.server_name, None),))
    found = keyring.resolve(origin.server_name, [origin.key_id], now_ms(), "192.0.2.1")
    assert list(found) == [origin.key_id]
    query = notary.requests[-1].json()
    assert list(query["server_keys"]) == [origin.server_name]
    assert notary.hits(KEYS) == 1  # the notary's own key, fetched to check its signature


def test_notary_signature_must_verify(make_keyring, start_peer):
    origin = start_peer("127.25.8.1:8448", "127.25.8.1", 8448)
    origin.stop()
    notary = _notary(start_peer, "127.25.8.2", origin)
    # The configured key has the notary's key id but other bytes: the signature fails.
    impostor = generate_signing_key(notary.signing_key.version)
    configured = TrustedKeyServer(
        notary.server_name, {notary.key_id: encode_verify_key_base64(get_verify_key(impostor))}
    )
    keyring = make_keyring(trusted=(configured,))
    assert keyring.resolve(origin.server_name, [origin.key_id], now_ms(), "192.0.2.1") == {}


def test_a_key_document_whose_signatures_are_not_a_map_is_refused_like_any_bad_one(
    make_keyring, start_peer
):
    """A document whose `signatures` is well-formed JSON of the wrong type is a malformed
    document: the notaries are still asked, and an origin none could vouch for is not asked
    again at once."""
    origin = start_peer("127.25.9.1:8448", "127.25.9.1", 8448)
    origin.route("GET", KEYS, lambda req: (200, dict(origin.key_document(), signatures=["x"])))
    notary = _notary(start_peer, "127.25.9.2", origin)
    keyring = make_keyring(trusted=(TrustedKeyServer(notary.server_name, None),))
    found = keyring.resolve(origin.server_name, [origin.key_id], now_ms(), "192.0.2.1")
    assert list(found) == [origin.key_id]
    assert notary.hits("/_matrix/key/v2/query") == 1

    liar = start_peer("127.25.9.3:8448", "127.25.9.3", 8448)
    liar.route("GET", KEYS, lambda req: (200, dict(liar.key_document(), signatures="x")))
    alone = make_keyring()
    for _ in range(2):
        assert alone.resolve(liar.server_name, [liar.key_id], now_ms(), "192.0.2.1") == {}
    assert liar.hits(KEYS) == 1


# --- a join's keys through the notaries in batches (Keyring.prefetch) -------------------

QUERY = "/_matrix/key/v2/query"


def batch_notary(start_peer, ip, origins: dict[str, FakeOrigin]):
    """A notary that vouches, in one answer, for every server it is asked about that it
    knows, and records how many it was asked about each time."""
    notary = start_peer(f"{ip}:8448", ip, 8448)
    notary.asked = []

    def query(req):
        names = list(req.json()["server_keys"])
        notary.asked.append(len(names))
        docs = [notary_signed(origins[n].key_document(), notary) for n in names if n in origins]
        return 200, {"server_keys": docs}

    notary.route("POST", QUERY, query)
    return notary


def notary_signed(document: dict, notary) -> dict:
    return sign_json(document, notary.server_name, notary.signing_key)


def test_a_rooms_servers_keys_come_in_batches_and_nothing_is_fetched_one_by_one(
    make_keyring, start_peer
):
    """150 servers that nobody could reach directly: two notary queries (100, then 50) bring
    every key, and the lookups that follow go to no network at all."""
    origins = {f"o{n}.prefetch.test": FakeOrigin(f"o{n}.prefetch.test") for n in range(150)}
    notary = batch_notary(start_peer, "127.25.20.2", origins)
    keyring = make_keyring(trusted=(TrustedKeyServer(notary.server_name, None),))
    wanted = {name: {o.key_id} for name, o in origins.items()}
    came = keyring.prefetch(wanted, now_ms(), OutboundDeadline(30, what="test"))
    assert came == set(origins)
    assert sorted(notary.asked) == [150 - MAX_NOTARY_QUERY_SERVERS, MAX_NOTARY_QUERY_SERVERS]
    fetches = keyring.network_fetches
    for name, origin in origins.items():
        assert list(keyring.resolve(name, [origin.key_id], now_ms(), None)) == [origin.key_id]
    assert keyring.network_fetches == fetches == 0
    # Known now: a second prefetch asks nobody.
    assert keyring.prefetch(wanted, now_ms(), OutboundDeadline(30, what="test")) == set()
    assert len(notary.asked) == 2


def test_a_batch_waits_for_a_key_budget_slot_within_the_deadline(make_keyring, start_peer):
    """The budget's one slot is held: the query waits for it rather than failing, and goes
    once it is free; with the slot never freed, the prefetch gives up at its deadline."""
    origins = {"a.prefetch.test": FakeOrigin("a.prefetch.test")}
    notary = batch_notary(start_peer, "127.25.21.2", origins)
    keyring = make_keyring(max_in_flight=1, trusted=(TrustedKeyServer(notary.server_name, None),))
    wanted = {"a.prefetch.test": {origins["a.prefetch.test"].key_id}}
    held = keyring.budget.try_acquire("someone")
    job = gevent.spawn(keyring.prefetch, wanted, now_ms(), OutboundDeadline(30, what="test"))
    gevent.sleep(0)  # the prefetch is refused a slot and waits
    assert not job.ready() and notary.asked == []
    held.release()
    assert job.get(timeout=10) == {"a.prefetch.test"}
    assert notary.asked == [1]
    assert keyring.budget.in_flight == 0

    other = {"b.prefetch.test": {"ed25519:x"}}
    held = keyring.budget.try_acquire("someone")
    try:
        assert keyring.prefetch(other, now_ms(), OutboundDeadline(1.5, what="test")) == set()
    finally:
        held.release()
    assert notary.asked == [1]
