// Two instances of one server on one PostgreSQL, each user's client on a different one,
// with matrix-js-sdk and its Rust crypto.
//
//   node instances.mjs <instance A's client URL> <scenario JSON>
//
// The scenario names two users and instance B's client URL ("other_url"). alice syncs on A,
// bob on B: she makes an encrypted room and invites him; each sends a message the other
// decrypts. Every step crosses instances: the invite and joins wake the other's /sync, the
// room keys are to-device messages and the devices are device list changes written on one
// instance and read on the other. Then bob's second device, on A, decrypts alice's next
// message. Prints what each device decrypted, by event ID.
//
// Behind a load balancer both URLs are the balancer's, and the scenario's "sessions"
// ({alice, bob, bob2}: logins made beforehand) are what put each device on its instance.
import {
    decrypted,
    invited,
    joinedRoom,
    knowsDevice,
    main,
    memberJoined,
    send,
    startDevice,
    step,
} from "./harness.mjs";

main(async ({ alice: a, bob: b, other_url: otherUrl, messages, sessions = {} }) => {
    const received = {};
    const note = (client, eventId, body) => {
        (received[client.getDeviceId()] ||= {})[eventId] = body.body;
    };
    const alice = await startDevice(a.user, a.password, undefined, sessions.alice);
    const bob = await startDevice(b.user, b.password, otherUrl, sessions.bob);
    const { room_id: roomId } = await alice.createRoom({
        invite: [bob.getUserId()],
        initial_state: [
            {
                type: "m.room.encryption",
                state_key: "",
                content: { algorithm: "m.megolm.v1.aes-sha2" },
            },
        ],
    });
    await step("alice joined", joinedRoom(alice, roomId));
    await step("bob invited, on the other instance", invited(bob));
    await bob.joinRoom(roomId);
    await step("bob joined", joinedRoom(bob, roomId));
    await step("alice sees bob joined", memberJoined(alice, roomId, bob.getUserId()));

    const fromAlice = await send(alice, roomId, messages.from_alice);
    note(bob, fromAlice, await step("bob decrypts alice", decrypted(bob, roomId, fromAlice)));
    const fromBob = await send(bob, roomId, messages.from_bob);
    note(alice, fromBob, await step("alice decrypts bob", decrypted(alice, roomId, fromBob)));

    // bob's second device logs in on A: alice hears of it through device_lists.changed.
    const bob2 = await startDevice(b.user, b.password, undefined, sessions.bob2);
    await step("bob2 sees the room", joinedRoom(bob2, roomId));
    await step("alice knows bob2", knowsDevice(alice, bob.getUserId(), bob2.getDeviceId()));
    const later = await send(alice, roomId, messages.later);
    note(bob2, later, await step("bob2 decrypts", decrypted(bob2, roomId, later)));
    note(bob, later, await step("bob decrypts later", decrypted(bob, roomId, later)));

    for (const client of [alice, bob, bob2]) client.stopClient();
    return {
        devices: { alice: alice.getDeviceId(), bob: bob.getDeviceId(), bob2: bob2.getDeviceId() },
        sent: { fromAlice, fromBob, later },
        received,
    };
});
