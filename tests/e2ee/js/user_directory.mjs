// Element's "Start chat" search, with matrix-js-sdk's searchUserDirectory.
//
//   node user_directory.mjs <homeserver URL> <scenario JSON>
//
// bob and carol set display names with the same word in them; bob joins alice's private
// room, carol joins none. alice searches for part of that word and for bob's user ID: she
// finds bob, with his name, and never carol. Prints what alice's client got.
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

main(async ({ alice: a, bob: b, carol: c }) => {
    const alice = await client(a.user, a.password);
    const bob = await client(b.user, b.password);
    const carol = await client(c.user, c.password);
    await bob.setDisplayName("Bartholomew Quillfeather");
    await carol.setDisplayName("Quillon Stranger");
    const { room_id: roomId } = await alice.createRoom({
        preset: "private_chat",
        invite: [bob.getUserId()],
    });
    await bob.joinRoom(roomId);

    const byName = await step("search by name", alice.searchUserDirectory({ term: "quill" }));
    const byId = await step(
        "search by user ID",
        alice.searchUserDirectory({ term: bob.getUserId(), limit: 5 }),
    );
    return { by_name: byName, by_id: byId, bob: bob.getUserId() };
});
