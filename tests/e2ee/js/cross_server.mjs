// A user on Weir and a user on another homeserver (a real Synapse in the test), each with
// matrix-js-sdk and its Rust crypto, in encrypted rooms across the two servers.
//
//   node cross_server.mjs <Weir client URL> <scenario JSON>
//
// The scenario names the Weir user, the other server's user with that server's client URL
// ("url"), and the plaintexts. Two rooms: one created on Weir, one on the other server; in
// each the creator invites the other user, who joins over federation, and each user sends a
// message the other must decrypt. Then, in Weir's room, a second device of each user, added
// later, decrypts what the other user sends next. Prints what each side decrypted.
import {
    decrypted,
    invitedTo,
    joinedRoom,
    knowsDevice,
    main,
    memberJoined,
    send,
    startDevice,
    step,
} from "./harness.mjs";

const ENCRYPTED = {
    type: "m.room.encryption",
    state_key: "",
    content: { algorithm: "m.megolm.v1.aes-sha2" },
};

// `creator` makes an encrypted room and invites `joiner`; each then sends a message.
async function encryptedRoomAcross(name, creator, joiner, messages) {
    const c = creator.client.getUserId();
    const j = joiner.client.getUserId();
    // As Element starts a direct chat: the invite is part of createRoom.
    const { room_id: roomId } = await creator.client.createRoom({
        preset: "trusted_private_chat",
        is_direct: true,
        invite: [j],
        initial_state: [ENCRYPTED],
    });
    await step(`${name}: ${c} joined`, joinedRoom(creator.client, roomId));
    await step(`${name}: ${j} invited`, invitedTo(joiner.client, roomId));
    await joiner.client.joinRoom(roomId);
    await step(`${name}: ${j} joined`, joinedRoom(joiner.client, roomId));
    // The creator encrypts to the devices of the members it knows: wait for the join.
    await step(`${name}: ${c} sees ${j} join`, memberJoined(creator.client, roomId, j));

    const out = { room_id: roomId, encrypted_room: {}, sent: {}, received: {} };
    for (const side of [creator, joiner]) {
        out.encrypted_room[side.name] = await side.client
            .getCrypto()
            .isEncryptionEnabledInRoom(roomId);
    }
    for (const [from, to] of [
        [creator, joiner],
        [joiner, creator],
    ]) {
        const eventId = await send(from.client, roomId, messages[from.name]);
        out.sent[from.name] = eventId;
        const label = `${name}: ${to.name} decrypts ${from.name}`;
        const content = await step(label, decrypted(to.client, roomId, eventId));
        out.received[to.name] = { event_id: eventId, body: content.body };
    }
    return out;
}

// A second device of `owner`'s user, added later: `peer`, on the other server, hears of it
// (m.device_list_update between the servers, then device_lists.changed and /keys/query
// through its own server) and shares its room key with it before it sends.
async function laterDevice(name, owner, peer, roomId, body) {
    const { user, password, url } = owner.login;
    const second = await startDevice(user, password, url);
    const userId = second.getUserId();
    const deviceId = second.getDeviceId();
    await step(`${name}: new device sees the room`, joinedRoom(second, roomId));
    await step(`${name}: ${peer.name} knows it`, knowsDevice(peer.client, userId, deviceId));
    const eventId = await send(peer.client, roomId, body);
    const content = await step(`${name}: it decrypts`, decrypted(second, roomId, eventId));
    const first = await step(`${name}: first decrypts`, decrypted(owner.client, roomId, eventId));
    second.stopClient();
    return { device_id: deviceId, event_id: eventId, body: content.body, first: first.body };
}

main(async ({ weir: w, synapse: s, messages }) => {
    const weir = { name: "weir", login: w, client: await startDevice(w.user, w.password) };
    const synapse = {
        name: "synapse",
        login: s,
        client: await startDevice(s.user, s.password, s.url),
    };
    const result = {
        devices: {
            weir: [weir.client.getUserId(), weir.client.getDeviceId()],
            synapse: [synapse.client.getUserId(), synapse.client.getDeviceId()],
        },
    };
    result.weir_room = await encryptedRoomAcross("weir_room", weir, synapse, messages.weir_room);
    result.synapse_room = await encryptedRoomAcross(
        "synapse_room",
        synapse,
        weir,
        messages.synapse_room,
    );
    const roomId = result.weir_room.room_id;
    result.later_devices = {
        weir: await laterDevice("weir2", weir, synapse, roomId, messages.later.to_weir2),
        synapse: await laterDevice("synapse2", synapse, weir, roomId, messages.later.to_synapse2),
    };
    for (const side of [weir, synapse]) side.client.stopClient();
    return result;
});
