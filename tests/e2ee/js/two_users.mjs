// Two users on one homeserver, with matrix-js-sdk and its Rust crypto (WASM, in Node).
//
//   node two_users.mjs <homeserver URL> <scenario JSON>
//
// The scenario names two registered users (with passwords) and the plaintexts to send.
// Prints what each device decrypted, by event ID.
import {
    decrypted,
    failureReason,
    invited,
    joinedRoom,
    knowsDevice,
    main,
    memberJoined,
    send,
    startDevice,
    step,
} from "./harness.mjs";

main(async ({ alice: a, bob: b, messages }) => {
    const result = { devices: {}, received: {} };
    const note = (client, eventId, content) => {
        const key = client.getDeviceId();
        (result.received[key] ||= {})[eventId] = content.body;
    };

    const alice = await startDevice(a.user, a.password);
    const bob = await startDevice(b.user, b.password);
    result.devices.alice = alice.getDeviceId();
    result.devices.bob = bob.getDeviceId();

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
    result.room_id = roomId;
    await step("alice joined", joinedRoom(alice, roomId));
    await step("bob invited", invited(bob));
    await bob.joinRoom(roomId);
    await step("bob joined", joinedRoom(bob, roomId));
    // Alice encrypts to the devices of the room's members: wait until she sees bob's join.
    await step("alice sees bob joined", memberJoined(alice, roomId, bob.getUserId()));
    result.encrypted_room = {
        alice: await alice.getCrypto().isEncryptionEnabledInRoom(roomId),
        bob: await bob.getCrypto().isEncryptionEnabledInRoom(roomId),
    };

    const fromAlice = await send(alice, roomId, messages.from_alice);
    note(bob, fromAlice, await step("bob decrypts alice", decrypted(bob, roomId, fromAlice)));
    const fromBob = await send(bob, roomId, messages.from_bob);
    note(alice, fromBob, await step("alice decrypts bob", decrypted(alice, roomId, fromBob)));

    // Bob's second device, added later: alice hears of it through device_lists.changed,
    // queries its keys, and shares her room key with it (Olm, to-device) before she sends.
    const bob2 = await startDevice(b.user, b.password);
    result.devices.bob2 = bob2.getDeviceId();
    await step("bob2 sees the room", joinedRoom(bob2, roomId));
    await step("alice knows bob2", knowsDevice(alice, bob.getUserId(), bob2.getDeviceId()));
    const afterSecond = await send(alice, roomId, messages.after_second_device);
    note(bob2, afterSecond, await step("bob2 decrypts", decrypted(bob2, roomId, afterSecond)));
    note(bob, afterSecond, await step("bob decrypts", decrypted(bob, roomId, afterSecond)));
    // What was sent before it existed stays unreadable to it: no key backup here.
    result.bob2_history = await step("bob2 history", failureReason(bob2, roomId, fromAlice));
    // And the new device's own message reaches alice and bob's first device.
    await step("bob2 knows alice", knowsDevice(bob2, alice.getUserId(), alice.getDeviceId()));
    const fromBob2 = await send(bob2, roomId, messages.from_bob2);
    note(alice, fromBob2, await step("alice decrypts bob2", decrypted(alice, roomId, fromBob2)));
    note(bob, fromBob2, await step("bob decrypts bob2", decrypted(bob, roomId, fromBob2)));

    result.sent = { fromAlice, fromBob, afterSecond, fromBob2 };
    for (const client of [alice, bob, bob2]) client.stopClient();
    return result;
});
