// A pusher as a mobile client sets one, through matrix-js-sdk: bob's setPusher with his
// push gateway's URL, read back with getPushers, then a message from alice that the
// gateway (tests/peers/push_gateway.py, run by the test) receives as a notify.
//
//   node pushers.mjs <homeserver URL> <scenario JSON>
//
// The scenario names alice, bob and the gateway's URL. Prints bob's pushers and what alice
// sent, for the test to find at the gateway.
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

main(async ({ alice: a, bob: b, gateway_url: url }) => {
    const alice = await client(a.user, a.password);
    const bob = await client(b.user, b.password);
    const { room_id: roomId } = await step(
        "create room",
        alice.createRoom({ name: "Pushed room", invite: [bob.getUserId()] }),
    );
    await step("bob joins", bob.joinRoom(roomId));
    await step(
        "set pusher",
        bob.setPusher({
            kind: "http",
            app_id: "org.weir.js",
            pushkey: "js-pushkey",
            app_display_name: "Weir js",
            device_display_name: "bob's phone",
            lang: "en",
            data: { url },
            append: false,
        }),
    );
    const { pushers } = await step("get pushers", bob.getPushers());
    const { event_id: eventId } = await step(
        "alice sends",
        alice.sendMessage(roomId, { msgtype: "m.text", body: "ring bob's phone" }),
    );
    return { pushers, event_id: eventId, room_id: roomId, alice: alice.getUserId() };
});
