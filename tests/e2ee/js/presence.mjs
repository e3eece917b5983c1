// Presence between two users of one homeserver, with matrix-js-sdk.
//
//   node presence.mjs <homeserver URL> <scenario JSON>
//
// alice's client sets her unavailable with a status message; bob's client learns it from its
// sync (User.presence) and from GET /presence. Prints what bob's client saw.
import { UserEvent } from "matrix-js-sdk";
import { invited, main, memberJoined, startDevice, step } from "./harness.mjs";

main(async ({ alice: a, bob: b, status }) => {
    const alice = await startDevice(a.user, a.password);
    const bob = await startDevice(b.user, b.password);
    const { room_id: roomId } = await alice.createRoom({ invite: [bob.getUserId()] });
    await step("bob invited", invited(bob));
    await bob.joinRoom(roomId);
    await step("alice sees bob joined", memberJoined(alice, roomId, bob.getUserId()));

    const seen = new Promise((resolve) => {
        bob.on(UserEvent.Presence, (event, user) => {
            if (user.userId === alice.getUserId() && user.presenceStatusMsg === status) {
                resolve(user);
            }
        });
    });
    await alice.setPresence({ presence: "unavailable", status_msg: status });
    const user = await step("bob's client sees alice's presence", seen);
    const fetched = await bob.getPresence(alice.getUserId());
    return {
        synced: { presence: user.presence, status_msg: user.presenceStatusMsg },
        fetched: { presence: fetched.presence, status_msg: fetched.status_msg },
    };
});
