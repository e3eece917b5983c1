// Two users on one homeserver, with matrix-js-sdk and its Rust crypto (WASM, in Node).
//
//   node two_users.mjs <homeserver URL> <scenario JSON>
//
// The scenario names two registered users (with passwords) and the plaintexts to send. Each
// device logs in, so it is a new device with fresh keys. Prints one JSON line on stdout: what
// each device decrypted, by event ID. The SDK's own logging goes to stderr.
import { ClientEvent, createClient, MatrixEventEvent, RoomEvent } from "matrix-js-sdk";
import { CryptoEvent } from "matrix-js-sdk/lib/crypto-api/index.js";
import { logger } from "matrix-js-sdk/lib/logger.js";

console.log = console.info = console.debug = console.error; // stdout is for the result
logger.setLevel(process.env.WEIR_JS_LOG_LEVEL || "warn");

const [baseUrl, scenarioJson] = process.argv.slice(2);
const scenario = JSON.parse(scenarioJson);
const STEP_MS = Number(process.env.WEIR_JS_STEP_MS || 60000);

function step(name, promise) {
    // Every wait is bounded: a stuck step names itself instead of hanging the test.
    let timer;
    const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out: ${name}`)), STEP_MS);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function login(user, password) {
    const response = await fetch(`${baseUrl}/_matrix/client/v3/login`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
            type: "m.login.password",
            identifier: { type: "m.id.user", user },
            password,
        }),
    });
    if (!response.ok) throw new Error(`login ${user}: ${response.status} ${await response.text()}`);
    return response.json();
}

async function startDevice(user, password) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    await client.initRustCrypto({ useIndexedDB: false });
    const synced = new Promise((resolve) => {
        client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await client.startClient({ initialSyncLimit: 20 });
    await step(`${session.device_id} first sync`, synced);
    return client;
}

// Resolves with an event's clear content once this client has decrypted it.
function decrypted(client, roomId, eventId) {
    return new Promise((resolve, reject) => {
        const check = () => {
            const event = client.getRoom(roomId)?.findEventById(eventId);
            if (!event) return;
            if (!event.isEncrypted()) {
                reject(new Error(`${eventId} arrived unencrypted`));
                return;
            }
            // Not yet decrypted, or not decryptable yet: a room key may still arrive.
            if (event.isBeingDecrypted() || event.isDecryptionFailure()) return;
            if (!event.getClearContent()) return;
            cleanup();
            resolve(event.getClearContent());
        };
        const cleanup = () => {
            client.off(MatrixEventEvent.Decrypted, check);
            client.off(RoomEvent.Timeline, check);
        };
        client.on(MatrixEventEvent.Decrypted, check);
        client.on(RoomEvent.Timeline, check);
        check();
    });
}

// Why `client` could not decrypt an event it holds (null if it could).
async function failureReason(client, roomId, eventId) {
    const event = client.getRoom(roomId)?.findEventById(eventId);
    if (!event) return "not in the timeline";
    await client.decryptEventIfNeeded(event);
    await event.getDecryptionPromise();
    return event.decryptionFailureReason;
}

function joinedRoom(client, roomId) {
    return new Promise((resolve) => {
        const check = () => {
            if (client.getRoom(roomId)?.getMyMembership() === "join") {
                client.off(ClientEvent.Room, check);
                client.off(RoomEvent.MyMembership, check);
                resolve();
            }
        };
        client.on(ClientEvent.Room, check);
        client.on(RoomEvent.MyMembership, check);
        check();
    });
}

function invited(client) {
    return new Promise((resolve) => {
        const check = () => {
            const room = client.getRooms().find((r) => r.getMyMembership() === "invite");
            if (room) {
                client.off(ClientEvent.Room, check);
                client.off(RoomEvent.MyMembership, check);
                resolve(room.roomId);
            }
        };
        client.on(ClientEvent.Room, check);
        client.on(RoomEvent.MyMembership, check);
        check();
    });
}

// Resolves once `client`'s crypto lists `deviceId` among `userId`'s devices: the sender
// encrypts to the devices it knows, so it must have seen the new one first.
function knowsDevice(client, userId, deviceId) {
    const crypto = client.getCrypto();
    return new Promise((resolve) => {
        const check = async () => {
            const devices = await crypto.getUserDeviceInfo([userId]);
            if (devices.get(userId)?.has(deviceId)) {
                client.off(CryptoEvent.DevicesUpdated, check);
                resolve();
            }
        };
        client.on(CryptoEvent.DevicesUpdated, check);
        check();
    });
}

async function send(client, roomId, body) {
    const { event_id: eventId } = await client.sendMessage(roomId, { msgtype: "m.text", body });
    return eventId;
}

async function main() {
    const { alice: a, bob: b, messages } = scenario;
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
}

function memberJoined(client, roomId, userId) {
    return new Promise((resolve) => {
        const check = () => {
            if (client.getRoom(roomId)?.getMember(userId)?.membership === "join") {
                client.off(RoomEvent.Timeline, check);
                resolve();
            }
        };
        client.on(RoomEvent.Timeline, check);
        check();
    });
}

main().then(
    (result) => {
        process.stdout.write(JSON.stringify(result) + "\n");
        process.exit(0);
    },
    (error) => {
        process.stdout.write(JSON.stringify({ error: String(error?.stack || error) }) + "\n");
        process.exit(1);
    },
);
