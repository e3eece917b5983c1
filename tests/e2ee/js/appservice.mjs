// A bridge's puppet as matrix-js-sdk clients see it: the application service's token
// registers a puppet in its namespace (m.login.application_service, on the SDK's
// authedRequest, as JS bridges do) and gets its session; the token alone, with `?user_id=`,
// acts as it (whoami). (The SDK's `queryParams` client option would add `user_id` to every
// request, but 37.5 stores it as `extraParams` and never reads it, so it is passed here.)
// The puppet's client joins alice's room and sends; alice's syncing client gets the message
// in her timeline and answers it (the test reads that answer from the fake appservice's
// transactions).
//
//   node appservice.mjs <homeserver URL> <scenario JSON>
import { ClientEvent, createClient, Method, RoomEvent } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

function timelineEvent(client, roomId, eventId) {
    return new Promise((resolve) => {
        const check = () => {
            const event = client.getRoom(roomId)?.findEventById(eventId);
            if (event) {
                client.off(RoomEvent.Timeline, check);
                resolve(event);
            }
        };
        client.on(RoomEvent.Timeline, check);
        check();
    });
}

main(async ({ alice: a, as_token: asToken, puppet: localpart }) => {
    const session = await login(a.user, a.password);
    const alice = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    const synced = new Promise((resolve) => {
        alice.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await alice.startClient({ initialSyncLimit: 20 });
    await step("alice's first sync", synced);

    const bridge = createClient({ baseUrl, accessToken: asToken });
    const registered = await step(
        "register the puppet",
        bridge.http.authedRequest(Method.Post, "/register", undefined, {
            type: "m.login.application_service",
            username: localpart,
        }),
    );
    const puppetId = registered.user_id;
    const whoami = await bridge.http.authedRequest(Method.Get, "/account/whoami", {
        user_id: puppetId,
    });
    const puppet = createClient({
        baseUrl,
        accessToken: registered.access_token,
        userId: puppetId,
        deviceId: registered.device_id,
    });

    const { room_id: roomId } = await alice.createRoom({ preset: "private_chat", invite: [puppetId] });
    await step("the puppet joins", puppet.joinRoom(roomId));
    const { event_id: fromPuppet } = await puppet.sendMessage(roomId, {
        msgtype: "m.text",
        body: "hello from the other network",
    });
    const seen = await step("alice sees it", timelineEvent(alice, roomId, fromPuppet));
    const { event_id: reply } = await alice.sendMessage(roomId, { msgtype: "m.text", body: "hello back" });
    alice.stopClient();
    return {
        puppet: puppetId,
        whoami: whoami.user_id,
        seen: { sender: seen.getSender(), body: seen.getContent().body },
        room_id: roomId,
        reply,
        alice: session.user_id,
    };
});
