// Edits, reactions and threads as Element shows them, with matrix-js-sdk (thread support on).
//
//   node relations.mjs <homeserver URL> <scenario JSON>
//
// alice edits a message, bob reacts to another, both reply in a thread; then bob's client
// starts and shows: the edited text (from its timeline, and from /event's bundled edit
// alone), the reaction (client side and through /relations), and the thread list from
// /threads with the thread's reply count, latest reply and replies (/relations). Prints
// what bob's client shows.
import { ClientEvent, createClient, RoomEvent, ThreadEvent } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function startClient(user, password, start = true) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    if (start) {
        const synced = new Promise((resolve) => {
            client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
        });
        // The SDK reads threadSupport from startClient's options, not createClient's.
        await client.startClient({ initialSyncLimit: 30, threadSupport: true });
        await step(`${user} first sync`, synced);
    }
    return client;
}

// Resolves once check() holds, looked at again whenever `emitter` emits one of `names`.
function until(emitter, names, check) {
    return new Promise((resolve) => {
        const look = () => {
            const value = check();
            if (value) {
                names.forEach((name) => emitter.off(name, look));
                resolve(value);
            }
        };
        names.forEach((name) => emitter.on(name, look));
        look();
    });
}

const text = (body) => ({ msgtype: "m.text", body });

main(async ({ alice: a, bob: b }) => {
    const alice = await startClient(a.user, a.password);
    const { room_id: roomId } = await alice.createRoom({ preset: "public_chat" });
    const bobSender = await startClient(b.user, b.password, false);
    await bobSender.joinRoom(roomId);

    const { event_id: original } = await alice.sendMessage(roomId, text("helo wrold"));
    await alice.sendMessage(roomId, {
        ...text("* hello world"),
        "m.new_content": text("hello world"),
        "m.relates_to": { rel_type: "m.replace", event_id: original },
    });
    const { event_id: reacted } = await alice.sendMessage(roomId, text("react to this"));
    await bobSender.sendEvent(roomId, "m.reaction", {
        "m.relates_to": { rel_type: "m.annotation", event_id: reacted, key: "👍" },
    });
    const { event_id: root } = await alice.sendMessage(roomId, text("a thread starts here"));
    await bobSender.sendMessage(roomId, root, text("bob replies in the thread"));
    const { event_id: last } = await alice.sendMessage(roomId, root, text("alice replies last"));

    const bob = await startClient(b.user, b.password);
    const room = bob.getRoom(roomId);
    const timelineEdit = room.findEventById(original)?.getContent().body;
    // /event alone: only the server's bundled edit can replace the content here.
    const fetched = bob.getEventMapper()(await bob.fetchRoomEvent(roomId, original));
    const reactions = room.relations.getChildEventsForEvent(reacted, "m.annotation", "m.reaction");
    const served = await bob.relations(roomId, reacted, "m.annotation", "m.reaction");

    await room.createThreadsTimelineSets();
    await room.fetchRoomThreads();
    const thread = await step(
        "bob's client has the thread and its replies",
        until(room, [ThreadEvent.Update, ThreadEvent.New, RoomEvent.Timeline], () => {
            const found = room.getThread(root);
            return found?.initialEventsFetched && found.length === 2 && found;
        }),
    );
    const listed = room.threadsTimelineSets[0].getLiveTimeline().getEvents();
    const mine = room.threadsTimelineSets[1].getLiveTimeline().getEvents();
    return {
        edited: { timeline: timelineEdit, fetched: fetched.getContent().body },
        replaced_by: fetched.replacingEventId(),
        reactions: {
            timeline: reactions ? [...reactions.getRelations()].map((e) => e.getRelation().key) : [],
            served: served.events.map((e) => e.getRelation()?.key),
        },
        threads: room.getThreads().map((t) => t.id),
        thread_list: listed.map((e) => e.getId()),
        my_threads: mine.map((e) => e.getId()),
        thread: {
            length: thread.length,
            latest: thread.replyToEvent?.getId(),
            latest_body: thread.replyToEvent?.getContent().body,
            participated: thread.hasCurrentUserParticipated,
            replies: thread.events.map((e) => e.getContent().body),
        },
        ids: { root, last },
    };
});
