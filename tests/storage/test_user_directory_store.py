"""The user directory's table on SQLite and PostgreSQL: words matched at their start, case
and accents aside, never as LIKE syntax; deactivated users never found; a redacted join
shows no name; and the migration's step filling it from what databases held before."""

import json

from homeserver.core.events import Event
from homeserver.storage.accounts import AccountStore
from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.profiles import ProfileStore
from homeserver.storage.redactions import RedactionStore
from homeserver.storage.user_directory import UserDirectoryStore, index_member, normalised_words

PUBLIC, PRIVATE, LEFT = "!public:hs", "!private:hs", "!left:hs"
SEARCHER = "@searcher:hs"


def local_user(db, user_id: str, **profile) -> None:
    assert AccountStore(db).create_user(user_id, None, False, 0)
    for field, value in profile.items():
        ProfileStore(db).set_field(user_id, field, value, 64 * 1024)


def found(db, term: str, all_local=True, searcher=SEARCHER) -> list[tuple]:
    users, _ = UserDirectoryStore(db).search(searcher, normalised_words(term), 50, all_local)
    return [(u.user_id, u.display_name, u.avatar_url) for u in users]


def ids(db, term: str, **kw) -> list[str]:
    return [row[0] for row in found(db, term, **kw)]


def add_room(db, room_id: str, join_rule: str, local_members: int | None = None) -> None:
    """The room's rows; `local_members` for room_stats' count of ours (0060 on)."""

    def write(tx):
        tx.execute(
            "INSERT INTO rooms (room_id, room_version, creator, created_ts) VALUES (?, '10', ?, 0)",
            (room_id, SEARCHER),
        )
        tx.execute(
            "INSERT INTO room_stats (room_id, join_rule) VALUES (?, ?)", (room_id, join_rule)
        )
        if local_members is not None:
            tx.execute(
                "UPDATE room_stats SET local_joined_members = ? WHERE room_id = ?",
                (local_members, room_id),
            )

    db.write(write)


def member_event(position: int, room_id: str, user_id: str, content: dict) -> Event:
    pdu = {"room_id": room_id, "type": "m.room.member", "state_key": user_id, "sender": user_id}
    pdu.update(content=content, depth=position, origin_server_ts=position)
    return Event(f"$m{position}", pdu)


def store_member(db, position: int, event: Event) -> None:
    """The event's row and its current state row, as a database before 0060 held them."""

    def write(tx):
        tx.execute(
            "INSERT INTO events (stream_ordering, event_id, room_id, type, state_key, sender,"
            " depth, origin_server_ts, membership, json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                position,
                event.event_id,
                event.room_id,
                event.type,
                event.state_key,
                event.sender,
                position,
                position,
                event.membership,
                json.dumps(event.pdu),
            ),
        )
        tx.execute(
            "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
            " VALUES (?, 'm.room.member', ?, ?, ?) ON CONFLICT (room_id, type, state_key)"
            " DO UPDATE SET event_id = excluded.event_id, membership = excluded.membership",
            (event.room_id, event.state_key, event.event_id, event.membership),
        )

    db.write(write)


def test_words_match_at_their_start_whatever_their_case_or_accents(db):
    local_user(db, "@jose:hs", displayname="José Núñez-Ålvik")
    local_user(db, "@a_b:hs")
    local_user(db, "@axb:hs", displayname="100% Sure")
    assert ids(db, "jose") == ["@jose:hs"]
    assert ids(db, "NÚÑ") == ["@jose:hs"]
    assert ids(db, "nunez alv") == ["@jose:hs"]
    assert ids(db, "unez") == []
    # `_` is a word character here and a wildcard to LIKE; `%` is no word at all.
    assert ids(db, "a_b") == ["@a_b:hs"]
    assert ids(db, "a_") == ["@a_b:hs"]
    assert ids(db, "100%") == ["@axb:hs"]
    assert ids(db, "%") == []
    assert ids(db, "hs") == ["@axb:hs", "@jose:hs", "@a_b:hs"]  # named ones first, by name


def test_deactivated_users_are_never_found(db):
    local_user(db, "@gone:hs", displayname="Gone Away")
    assert ids(db, "gone") == ["@gone:hs"]
    db.write(lambda tx: tx.execute("UPDATE users SET deactivated = 1 WHERE user_id = '@gone:hs'"))
    assert ids(db, "gone") == []


def joined(db, position: int, room_id: str, user_id: str, name: str | None = None) -> Event:
    content = {"membership": "join", **({"displayname": name} if name else {})}
    event = member_event(position, room_id, user_id, content)
    store_member(db, position, event)
    db.write(lambda tx: index_member(tx, event))
    return event


def test_a_remote_users_name_comes_from_their_joins_to_public_rooms_only(db):
    add_room(db, PUBLIC, "public", local_members=1)
    add_room(db, PRIVATE, "invite", local_members=1)
    joined(db, 1, PRIVATE, SEARCHER)
    joined(db, 2, PRIVATE, "@rem:far", "Private Nick")
    assert found(db, "nick", all_local=False) == []
    assert found(db, "@rem:far", all_local=False) == [("@rem:far", None, None)]
    joined(db, 3, PUBLIC, "@rem:far", "Public Name")
    joined(db, 4, PRIVATE, "@rem:far", "Another Nick")
    assert found(db, "rem", all_local=False) == [("@rem:far", "Public Name", None)]
    assert found(db, "nick", all_local=False) == []


def test_a_redacted_remote_join_shows_no_name(db):
    add_room(db, PUBLIC, "public", local_members=1)
    join = joined(db, 1, PUBLIC, "@rem:far", "Far Away")
    assert found(db, "far away", all_local=False) == [("@rem:far", "Far Away", None)]
    redacted = dict(join.pdu, content={"membership": "join"})
    db.write(lambda tx: RedactionStore.apply(tx, join, redacted, {}, "$r", 1))
    assert found(db, "far away", all_local=False) == []
    assert found(db, "@rem:far", all_local=False) == [("@rem:far", None, None)]


def test_the_migration_fills_the_directory_from_profiles_and_joins(empty_database_url):
    db = open_database(empty_database_url)
    try:
        migrate(db, until=59)

        def users(tx):
            for user_id, deactivated in (("@old:hs", 0), ("@plain:hs", 0), ("@gone:hs", 1)):
                tx.execute(
                    "INSERT INTO users (user_id, admin, created_ts, deactivated)"
                    " VALUES (?, 0, 0, ?)",
                    (user_id, deactivated),
                )
            for user_id, field, value in (
                ("@old:hs", "displayname", "Old Timer"),
                ("@old:hs", "avatar_url", "mxc://hs/old"),
                ("@gone:hs", "displayname", "Gone Timer"),
            ):
                tx.execute(
                    "INSERT INTO profile_fields (user_id, field, value) VALUES (?, ?, ?)",
                    (user_id, field, json.dumps(value)),
                )

        db.write(users)
        add_room(db, PUBLIC, "public")
        add_room(db, PRIVATE, "invite")
        add_room(db, LEFT, "public")  # public, but none of ours is in it any more
        joins = [
            (PUBLIC, "@old:hs", {"membership": "join", "displayname": "Room Nick"}),
            (PUBLIC, "@rem:far", {"membership": "join", "displayname": "Remote Early"}),
            (PRIVATE, "@rem:far", {"membership": "join", "displayname": "Remote Later"}),
            (PRIVATE, "@hidden:far", {"membership": "join", "displayname": "Secret Nick"}),
            (PRIVATE, "@plain:hs", {"membership": "join"}),
            (PUBLIC, "@left:far", {"membership": "join", "displayname": "Left Behind"}),
            (PUBLIC, "@left:far", {"membership": "leave"}),
            (LEFT, "@ghost:far", {"membership": "join", "displayname": "Ghost Far"}),
            (LEFT, "@old:hs", {"membership": "join"}),
            (LEFT, "@old:hs", {"membership": "leave"}),
        ]
        for position, (room_id, user_id, content) in enumerate(joins, start=1):
            store_member(db, position, member_event(position, room_id, user_id, content))
        migrate(db)

        # A local user keeps their profile's name, never a room's.
        assert found(db, "timer", all_local=False) == [("@old:hs", "Old Timer", "mxc://hs/old")]
        assert found(db, "nick", all_local=False) == []
        # Another server's user: named by the newest of their joins to a public room.
        assert found(db, "remote", all_local=False) == [("@rem:far", "Remote Early", None)]
        assert found(db, "later", all_local=False) == []
        # Or by none, found by user ID where the searcher may see them.
        assert found(db, "secret", searcher="@plain:hs", all_local=False) == []
        hidden = found(db, "@hidden:far", searcher="@plain:hs", all_local=False)
        assert hidden == [("@hidden:far", None, None)]
        assert found(db, "left", all_local=False) == []
        assert found(db, "ghost", all_local=False) == []
        assert ids(db, "plain", all_local=False) == []  # in no room the searcher sees
        assert ids(db, "plain") == ["@plain:hs"]  # every local user
        assert ids(db, "timer") == ["@old:hs"]  # never a deactivated one
        # And users made afterwards are indexed beside them.
        local_user(db, "@new:hs", displayname="New Timer")
        assert ids(db, "timer") == ["@old:hs", "@new:hs"]
    finally:
        db.close()
