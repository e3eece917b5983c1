// A permalink and a jump to date as Element does them, with matrix-js-sdk (timeline support on).
//
//   node context.mjs <homeserver URL> <scenario JSON>
//
// alice sends 30 messages; a client of hers that starts afterwards (its first sync holds the
// last 5 alone) opens the 5th through getEventTimeline, which reads /context, and jumps to
// the 5th's time with timestampToEvent. Prints the bodies of the timeline it got around
// that event and what the jump found.
import { ClientEvent, createClient, Direction } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function startClient(user, password) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
        timelineSupport: true,
    });
    const synced = new Promise((resolve) => {
        client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await client.startClient({ initialSyncLimit: 5 });
    await step(`${user} first sync`, synced);
    return client;
}

main(async ({ alice: a }) => {
    const sender = createClient({ baseUrl, ...(await session(a)) });
    const { room_id: roomId } = await sender.createRoom({ preset: "private_chat" });
    const ids = [];
    for (let i = 1; i <= 30; i++) {
        const { event_id } = await sender.sendMessage(roomId, { msgtype: "m.text", body: `m${i}` });
        ids.push(event_id);
    }
    const alice = await startClient(a.user, a.password);
    const room = alice.getRoom(roomId);
    const liveBefore = room.getLiveTimeline().getEvents().some((e) => e.getId() === ids[4]);
    const timeline = await step(
        "permalink timeline",
        alice.getEventTimeline(room.getUnfilteredTimelineSet(), ids[4]),
    );
    const bodies = timeline
        .getEvents()
        .filter((e) => e.getType() === "m.room.message")
        .map((e) => e.getContent().body);
    const fifth = await alice.fetchRoomEvent(roomId, ids[4]);
    const jumped = await alice.timestampToEvent(roomId, fifth.origin_server_ts, Direction.Forward);
    const hasEvent = timeline.getEvents().some((e) => e.getId() === ids[4]);
    return {
        live_had_it: liveBefore,
        bodies,
        has_event: hasEvent,
        jumped,
        fifth: { event_id: ids[4], origin_server_ts: fifth.origin_server_ts },
        ids,
    };
});

async function session(user) {
    const s = await login(user.user, user.password);
    return { userId: s.user_id, deviceId: s.device_id, accessToken: s.access_token };
}
