// A space as Element's space home shows it, with matrix-js-sdk.
//
//   node spaces.mjs <homeserver URL> <scenario JSON>
//
// alice creates a space and a room, links them both ways (m.space.child, m.space.parent),
// then alice, and bob who is in neither, ask for the space's hierarchy with
// getRoomHierarchy; a second, paged walk of one room a page follows next_batch.
// Prints the rooms each is shown.
import { createClient } from "matrix-js-sdk";
import { login, main } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function connect(user, password) {
    const session = await login(user, password);
    return createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
}

const shown = (hierarchy) =>
    hierarchy.rooms.map((room) => ({
        room_id: room.room_id,
        name: room.name,
        room_type: room.room_type ?? null,
        children: room.children_state.map((event) => event.state_key),
    }));

main(async ({ alice: a, bob: b }) => {
    const alice = await connect(a.user, a.password);
    const server = alice.getUserId().split(":").slice(1).join(":");
    const { room_id: spaceId } = await alice.createRoom({
        name: "Team",
        preset: "public_chat",
        creation_content: { type: "m.space" },
    });
    const { room_id: roomId } = await alice.createRoom({ name: "General", preset: "public_chat" });
    await alice.sendStateEvent(spaceId, "m.space.child", { via: [server], suggested: true }, roomId);
    await alice.sendStateEvent(roomId, "m.space.parent", { via: [server], canonical: true }, spaceId);

    const bob = await connect(b.user, b.password);
    const pages = [];
    let from;
    do {
        const page = await bob.getRoomHierarchy(spaceId, 1, undefined, false, from);
        pages.push(page.rooms.map((room) => room.room_id));
        from = page.next_batch;
    } while (from);
    return {
        ids: { space: spaceId, room: roomId },
        alice: shown(await alice.getRoomHierarchy(spaceId)),
        bob: shown(await bob.getRoomHierarchy(spaceId, 50, 1, true)),
        pages,
    };
});
