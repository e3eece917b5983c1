// Element's search box in an unencrypted room, with matrix-js-sdk's searchRoomEvents (as
// Element calls it: newest first, one event of context either side, profiles).
//
//   node search.mjs <homeserver URL> <scenario JSON>
//
// alice sends a message between two others, then ten more with the same word; bob, who
// joined before them, searches: the first page has ten results and a next batch, and the
// next page (backPaginateRoomEventsSearch) the first message with its context. Prints what
// bob's client holds.
import { createClient } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function client(user, password) {
    const session = await login(user, password);
    return createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
}

const text = (body) => ({ msgtype: "m.text", body });

main(async ({ alice: a, bob: b }) => {
    const alice = await client(a.user, a.password);
    const bob = await client(b.user, b.password);
    const { room_id: roomId } = await alice.createRoom({ preset: "public_chat" });
    await bob.joinRoom(roomId);
    await alice.sendMessage(roomId, text("before the map"));
    const { event_id: buried } = await alice.sendMessage(roomId, text("the treasure is buried"));
    await alice.sendMessage(roomId, text("after the map"));
    for (let i = 0; i < 10; i++) await alice.sendMessage(roomId, text(`treasure chest ${i}`));

    const results = await step("search", bob.searchRoomEvents({ term: "treasure" }));
    const firstPage = results.results.length;
    const hadNextBatch = Boolean(results.next_batch);
    await step("next page", bob.backPaginateRoomEventsSearch(results));
    const last = results.results[results.results.length - 1];
    const timeline = last.context.getTimeline();
    const ours = last.context.getOurEventIndex();
    return {
        count: results.count,
        highlights: results.highlights,
        first_page: firstPage,
        had_next_batch: hadNextBatch,
        more: Boolean(results.next_batch),
        bodies: results.results.map((r) => r.context.getEvent().getContent().body),
        last: {
            event_id: last.context.getEvent().getId(),
            sender: last.context.getEvent().getSender(),
            before: timeline.slice(0, ours).map((e) => e.getContent().body),
            after: timeline.slice(ours + 1).map((e) => e.getContent().body),
        },
        buried,
        alice: alice.getUserId(),
    };
});
