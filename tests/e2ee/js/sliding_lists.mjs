// A room list as Element draws it from simplified sliding sync (MSC4186): matrix-js-sdk's
// SlidingSync under a MatrixClient, one list `[[0, 9]]` over the user's rooms, the order the
// client's own (MSC4186 sends no order: rooms by the `bump_stamp` each carries).
//
//   node sliding_lists.mjs <homeserver URL> <scenario JSON>
//
// The scenario names the rooms, the order of one message in each, a busy room and the rooms
// that move; the same scenario runs against Weir and against Synapse, and the test compares
// what the client saw. Steps: the first list; a message in a room outside it, timed until
// the room heads the client's list; a reaction in a listed room (not "proper" activity: it
// does not move the room); a subscription with a 20-event timeline to the busy room.
import { ClientEvent, createClient } from "matrix-js-sdk";
import { SlidingSync, SlidingSyncEvent, SlidingSyncState } from "matrix-js-sdk/lib/sliding-sync.js";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);
const LIST = {
    ranges: [[0, 9]],
    timeline_limit: 1,
    required_state: [
        ["m.room.name", ""],
        ["m.room.create", ""],
        ["m.room.avatar", ""],
    ],
};
const SUBSCRIPTION = { timeline_limit: 20, required_state: [["m.room.name", ""]] };

// The client API as the scenario's writer uses it: the same account, plain requests.
function api(session) {
    return async (method, path, body) => {
        const response = await fetch(`${baseUrl}/_matrix/client/v3${path}`, {
            method,
            headers: {
                "Content-Type": "application/json",
                Authorization: `Bearer ${session.access_token}`,
            },
            body: JSON.stringify(body),
        });
        if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${await response.text()}`);
        return response.json();
    };
}

let txn = 0;
async function say(call, roomId, body) {
    const path = `/rooms/${encodeURIComponent(roomId)}/send/m.room.message/t${txn++}`;
    return (await call("PUT", path, { msgtype: "m.text", body })).event_id;
}

// Waits on the client's sliding sync responses until `done(resp)` holds after one.
function afterResponse(slidingSync, done) {
    return new Promise((resolve) => {
        const check = (state, resp) => {
            if (state !== SlidingSyncState.Complete || !resp) return;
            const value = done(resp);
            if (value) {
                slidingSync.off(SlidingSyncEvent.Lifecycle, check);
                resolve(value);
            }
        };
        slidingSync.on(SlidingSyncEvent.Lifecycle, check);
    });
}

main(async ({ user, password, names, order, busy, busy_messages: busyCount, moved, reacted }) => {
    const session = await login(user, password);
    const call = api(session);
    const rooms = [];
    for (const name of names) rooms.push((await call("POST", "/createRoom", { name })).room_id);
    const indexOf = new Map(rooms.map((roomId, i) => [roomId, i]));
    for (let n = 1; n <= busyCount; n++) await say(call, rooms[busy], `${names[busy]} busy ${n}`);
    const lastMessage = new Map();
    for (const i of order) lastMessage.set(i, await say(call, rooms[i], `last in ${names[i]}`));

    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    const slidingSync = new SlidingSync(baseUrl, new Map([["all", LIST]]), SUBSCRIPTION, client, 10000);
    // The rooms the list sent (a subscription's room is not in it), and each room's raw data.
    const listed = new Set();
    const raw = new Map();
    slidingSync.on(SlidingSyncEvent.RoomData, (roomId, data) => {
        if (!slidingSync.getRoomSubscriptions().has(roomId)) listed.add(roomId);
        raw.set(roomId, data);
    });
    // The client's list: what the list sent, by bump_stamp, as Element's room list sorts.
    const clientList = () =>
        [...listed]
            .map((roomId) => client.getRoom(roomId))
            .sort((a, b) => (b.getBumpStamp() ?? 0) - (a.getBumpStamp() ?? 0))
            .slice(0, 10)
            .map((room) => ({ index: indexOf.get(room.roomId), name: room.name }));

    const synced = new Promise((resolve) => {
        client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await client.startClient({ slidingSync });
    await step("first sliding sync", synced);
    const first = { list: clientList(), count: slidingSync.getListData("all").joinedCount };
    first.timelines = first.list.map(({ index }) => raw.get(rooms[index]).timeline.map((e) => e.event_id));
    first.expected_timelines = first.list.map(({ index }) => [lastMessage.get(index)]);

    // A message outside the list: timed from the send until the client's list has its room first.
    const top = afterResponse(slidingSync, () => clientList()[0].index === moved);
    const started = performance.now();
    await say(call, rooms[moved], "to the top");
    const sentMs = performance.now() - started;
    await step("the message moves its room to the top", top);
    const move = {
        ms: performance.now() - started,
        send_ms: sentMs,
        list: clientList(),
        count: slidingSync.getListData("all").joinedCount,
    };

    // A reaction in a listed room: the room is sent again; whether it moves is its bump_stamp's.
    const target = lastMessage.get(reacted);
    const reactionPath = `/rooms/${encodeURIComponent(rooms[reacted])}/send/m.reaction/t${txn++}`;
    const reactionEvent = afterResponse(slidingSync, () =>
        (raw.get(rooms[reacted])?.timeline || []).some((e) => e.type === "m.reaction"),
    );
    await call("PUT", reactionPath, {
        "m.relates_to": { rel_type: "m.annotation", event_id: target, key: "👍" },
    });
    await step("the reaction arrives", reactionEvent);
    const reaction = { list: clientList(), bump_stamp_sent: "bump_stamp" in raw.get(rooms[reacted]) };

    // A subscription to the busy room, which the list never sent: its last 20 events.
    const subscribed = afterResponse(slidingSync, (resp) => resp.rooms[rooms[busy]]);
    slidingSync.modifyRoomSubscriptions(new Set([rooms[busy]]));
    const data = await step("the subscription's room", subscribed);
    const subscription = {
        count: data.timeline.length,
        bodies: data.timeline.map((e) => e.content?.body),
        limited: data.limited === true,
        initial: data.initial === true,
        has_prev_batch: typeof data.prev_batch === "string",
        client_bodies: client
            .getRoom(rooms[busy])
            .getLiveTimeline()
            .getEvents()
            .filter((e) => e.getType() === "m.room.message")
            .map((e) => e.getContent().body),
    };
    slidingSync.stop();
    client.stopClient();
    return { first, move, reaction, subscription };
});
