// Element's path on simplified sliding sync (MSC4186): bob's client syncs through
// matrix-js-sdk's SlidingSync class (its MatrixClient started with `slidingSync`, the rust
// crypto fed by the to_device and e2ee extensions), alice's through /sync.
//
//   node sliding.mjs <homeserver URL> <scenario JSON>
//
// alice invites bob to an encrypted room; bob's list shows the invite with its stripped
// state, he joins, and they exchange encrypted messages both ways: the room key reaches
// bob as a to-device message of the extension, and his client learns alice's devices from
// the e2ee extension. Prints what the clients hold.
import { ClientEvent, createClient } from "matrix-js-sdk";
import { SlidingSync, SlidingSyncEvent, SlidingSyncState } from "matrix-js-sdk/lib/sliding-sync.js";
import {
    decrypted,
    invitedTo,
    joinedRoom,
    knowsDevice,
    login,
    main,
    memberJoined,
    oneTimeKeysUploaded,
    send,
    startDevice,
    step,
} from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);
const ROOM = { timeline_limit: 10, required_state: [["*", "*"]] };

async function slidingDevice(user, password, seen) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    await client.initRustCrypto({ useIndexedDB: false });
    const lists = new Map([["all", { ranges: [[0, 19]], ...ROOM }]]);
    const slidingSync = new SlidingSync(baseUrl, lists, ROOM, client, 10000);
    slidingSync.on(SlidingSyncEvent.Lifecycle, (state, resp) => {
        if (state === SlidingSyncState.Complete && resp) {
            seen.responses += 1;
            for (const [roomId, room] of Object.entries(resp.rooms)) {
                if (room.invite_state) seen.invites.push(roomId);
            }
            seen.to_device += (resp.extensions.to_device?.events || []).length;
        }
    });
    const synced = new Promise((resolve) => {
        client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await client.startClient({ slidingSync });
    await step(`${session.device_id} first sliding sync`, synced);
    await step(`${session.device_id} one-time keys`, oneTimeKeysUploaded(session));
    return { client, slidingSync };
}

main(async ({ alice: a, bob: b }) => {
    const seen = { responses: 0, invites: [], to_device: 0 };
    const alice = await startDevice(a.user, a.password);
    const { client: bob, slidingSync } = await slidingDevice(b.user, b.password, seen);
    const { room_id: roomId } = await alice.createRoom({
        name: "Sliding secrets",
        invite: [bob.getUserId()],
        initial_state: [
            {
                type: "m.room.encryption",
                state_key: "",
                content: { algorithm: "m.megolm.v1.aes-sha2" },
            },
        ],
    });
    await step("bob sees the invite", invitedTo(bob, roomId));
    const inviteName = bob.getRoom(roomId).name;
    await bob.joinRoom(roomId);
    await step("bob joined", joinedRoom(bob, roomId));
    await step("alice sees bob join", memberJoined(alice, roomId, bob.getUserId()));
    await step("alice knows bob's device", knowsDevice(alice, bob.getUserId(), bob.getDeviceId()));
    const toBob = await send(alice, roomId, "a secret over sliding sync");
    const bobRead = await step("bob decrypts", decrypted(bob, roomId, toBob));
    const toAlice = await send(bob, roomId, "and one back");
    const aliceRead = await step("alice decrypts", decrypted(alice, roomId, toAlice));
    const result = {
        room_id: roomId,
        invite_name: inviteName,
        invites_seen: seen.invites,
        bob_read: bobRead.body,
        alice_read: aliceRead.body,
        encrypted_for_bob: bob.getRoom(roomId).hasEncryptionStateEvent(),
        list_count: slidingSync.getListData("all").joinedCount,
        to_device_seen: seen.to_device,
        responses: seen.responses,
    };
    slidingSync.stop();
    alice.stopClient();
    bob.stopClient();
    return result;
});
