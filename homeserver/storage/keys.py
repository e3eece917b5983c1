"""Other servers' verify keys and key documents (the keyring's database cache)."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database


@dataclass(frozen=True)
class StoredKey:
    key_id: str
    verify_key: str  # unpadded base64
    valid_until_ts: int
    expired_ts: int | None  # set for a key the server listed in old_verify_keys


@dataclass(frozen=True)
class KeyDocument:
    server_name: str
    valid_until_ts: int
    key_json: str
    fetched_ts: int


class ServerKeyStore:
    def __init__(self, db: Database):
        self.db = db

    def get_keys(self, server_name: str) -> dict[str, StoredKey]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT key_id, verify_key, valid_until_ts, expired_ts FROM server_signing_keys"
                " WHERE server_name = ?",
                (server_name,),
            )
        )
        return {
            r[0]: StoredKey(r[0], r[1], int(r[2]), None if r[3] is None else int(r[3]))
            for r in rows
        }

    def get_document(self, server_name: str) -> KeyDocument | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT valid_until_ts, key_json, fetched_ts FROM server_key_documents"
                " WHERE server_name = ?",
                (server_name,),
            )
        )
        return KeyDocument(server_name, int(row[0]), row[1], int(row[2])) if row else None

    def store_document(
        self,
        server_name: str,
        key_json: str,
        valid_until_ts: int,
        keys: list[StoredKey],
        now_ms: int,
    ) -> None:
        """Records a verified key document and the keys it lists, in one transaction.

        A document older than the one held (by ``valid_until_ts``) does not replace it, but
        its keys are still recorded: they were verified all the same.
        """

        def tx(tx):
            tx.execute(
                "INSERT INTO server_key_documents (server_name, valid_until_ts, key_json,"
                " fetched_ts) VALUES (?, ?, ?, ?) ON CONFLICT (server_name) DO UPDATE SET"
                " valid_until_ts = excluded.valid_until_ts, key_json = excluded.key_json,"
                " fetched_ts = excluded.fetched_ts"
                " WHERE excluded.valid_until_ts >= server_key_documents.valid_until_ts",
                (server_name, valid_until_ts, key_json, now_ms),
            )
            tx.executemany(
                "INSERT INTO server_signing_keys (server_name, key_id, verify_key,"
                " valid_until_ts, expired_ts, fetched_ts) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (server_name, key_id) DO UPDATE SET"
                " verify_key = excluded.verify_key, valid_until_ts = excluded.valid_until_ts,"
                " expired_ts = excluded.expired_ts, fetched_ts = excluded.fetched_ts"
                # An expiry always counts; otherwise the later validity wins.
                " WHERE excluded.expired_ts IS NOT NULL"
                " OR excluded.valid_until_ts >= server_signing_keys.valid_until_ts",
                [
                    (server_name, k.key_id, k.verify_key, k.valid_until_ts, k.expired_ts, now_ms)
                    for k in keys
                ],
            )

        self.db.write(tx)
