"""A real application service for the tests: mautrix's AppService (asyncio and aiohttp),
run in a process of its own, never inside the gevent test process.

    python mautrix_bridge.py CONFIG.json

CONFIG names the homeserver, the tokens and where to listen. The script prints one JSON
line per thing that happens: {"ready": true} once it listens, {"event": {...}} for each event
of a transaction, and {"id": n, ...} answering each command read from stdin (one JSON
object a line): {"id", "op": "send_as", "user", "room", "text"} registers the puppet if
needed, joins it and sends as it (masquerading with ?user_id=); {"id", "op": "ping"}
pings itself through the homeserver (`/appservice/{id}/ping`); {"id", "op": "quit"}.
"""

import asyncio
import json
import sys

from mautrix.appservice import AppService
from mautrix.types import Event


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def run(config: dict) -> None:
    async def query_alias(alias: str):
        emit({"query_alias": alias})
        return None  # it makes no room: the homeserver answers 404 after asking

    appservice = AppService(
        server=config["homeserver"],
        domain=config["domain"],
        as_token=config["as_token"],
        hs_token=config["hs_token"],
        bot_localpart=config["sender_localpart"],
        id=config["id"],
        query_alias=query_alias,
        state_store=None,
    )

    async def on_event(event: Event) -> None:
        emit({"event": event.serialize()})

    appservice.matrix_event_handler(on_event)
    await appservice.start(config["host"], config["port"])
    emit({"ready": True})
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "quit":
            break
        try:
            emit({"id": command["id"], **await perform(appservice, command)})
        except Exception as e:  # the test reads what went wrong
            emit({"id": command["id"], "error": f"{type(e).__name__}: {e}"})
    await appservice.stop()


async def perform(appservice: AppService, command: dict) -> dict:
    if command["op"] == "send_as":
        intent = appservice.intent.user(command["user"])
        await intent.ensure_registered()
        await intent.ensure_joined(command["room"])
        event_id = await intent.send_text(command["room"], command["text"])
        whoami = await intent.whoami()
        return {"event_id": event_id, "whoami": whoami.user_id}
    if command["op"] == "ping":
        return {"duration_ms": await appservice.ping_self(command.get("txn_id"))}
    raise ValueError(f"unknown op {command['op']!r}")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(run(json.load(f)))
