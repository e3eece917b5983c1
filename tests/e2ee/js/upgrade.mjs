// A room upgrade as Element follows one, with matrix-js-sdk's upgradeRoom.
//
//   node upgrade.mjs <homeserver URL> <scenario JSON>
//
// alice upgrades a room bob is in; bob's running client sees the tombstone in the room's
// state, can no longer talk there, joins the replacement the tombstone names, and finds the
// old room again from the new one (findPredecessor, and getRoomUpgradeHistory with its links
// checked both ways). Prints what bob's client holds.
import { ClientEvent, createClient, RoomEvent } from "matrix-js-sdk";
import { joinedRoom, login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function client(user, password, start) {
    const session = await login(user, password);
    const made = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    if (start) {
        const synced = new Promise((resolve) => {
            made.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
        });
        await made.startClient({ initialSyncLimit: 20 });
        await step(`${user} first sync`, synced);
    }
    return made;
}

// Resolves with the room's tombstone once bob's client holds it in the room's state.
function tombstoned(bob, roomId) {
    return new Promise((resolve) => {
        const look = () => {
            const event = bob.getRoom(roomId)?.currentState.getStateEvents("m.room.tombstone", "");
            if (event) {
                bob.off(RoomEvent.Timeline, look);
                resolve(event);
            }
        };
        bob.on(RoomEvent.Timeline, look);
        look();
    });
}

main(async ({ alice: a, bob: b, version }) => {
    const alice = await client(a.user, a.password, false);
    const bob = await client(b.user, b.password, true);
    const { room_id: oldRoom } = await alice.createRoom({ preset: "public_chat", name: "Lobby" });
    await bob.joinRoom(oldRoom);
    await step("bob in the old room", joinedRoom(bob, oldRoom));

    const upgraded = await step("upgrade", alice.upgradeRoom(oldRoom, version));
    const newRoom = upgraded.replacement_room;
    const tombstone = await step("tombstone", tombstoned(bob, oldRoom));
    let refusal = null;
    try {
        await bob.sendMessage(oldRoom, { msgtype: "m.text", body: "anyone here?" });
    } catch (error) {
        refusal = { status: error.httpStatus, errcode: error.errcode };
    }

    await bob.joinRoom(tombstone.getContent().replacement_room);
    await step("bob in the new room", joinedRoom(bob, newRoom));
    const room = bob.getRoom(newRoom);
    const history = bob.getRoomUpgradeHistory(newRoom, true).map((r) => r.roomId);
    return {
        old_room: oldRoom,
        new_room: newRoom,
        tombstone: { sender: tombstone.getSender(), content: tombstone.getContent() },
        tombstone_id: tombstone.getId(),
        refusal,
        predecessor: room.findPredecessor(),
        history,
        name: room.name,
        version: room.getVersion(),
        alice: alice.getUserId(),
    };
});
