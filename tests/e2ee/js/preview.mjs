// A link preview as Element shows one: alice sends a message with a link, and her client asks
// for the link's preview as of the message's time with matrix-js-sdk's getUrlPreview (the
// legacy /_matrix/media/v3/preview_url).
//
//   node preview.mjs <homeserver URL> <scenario JSON>
//
// The scenario names the page's URL. Prints the preview.
import { createClient } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

main(async ({ alice: a, url }) => {
    const session = await login(a.user, a.password);
    const alice = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    const { room_id: roomId } = await alice.createRoom({ preset: "private_chat" });
    const { event_id: eventId } = await alice.sendMessage(roomId, {
        msgtype: "m.text",
        body: `look at ${url}`,
    });
    const event = await alice.fetchRoomEvent(roomId, eventId);
    const og = await step("preview", alice.getUrlPreview(url, event.origin_server_ts));
    return { og };
});
