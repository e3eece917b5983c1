// What the harness's scenarios share: argument parsing, bounded waits, devices that log in
// with a password (each login is a new device with fresh keys, kept in memory), and waits on
// the SDK's events. A scenario prints one JSON line on stdout; the SDK's logging goes to stderr.
import { ClientEvent, createClient, MatrixEventEvent, RoomEvent } from "matrix-js-sdk";
import { CryptoEvent } from "matrix-js-sdk/lib/crypto-api/index.js";
import { logger } from "matrix-js-sdk/lib/logger.js";

console.log = console.info = console.debug = console.error; // stdout is for the result
logger.setLevel(process.env.WEIR_JS_LOG_LEVEL || "warn");

const [baseUrl, scenarioJson] = process.argv.slice(2);
const STEP_MS = Number(process.env.WEIR_JS_STEP_MS || 60000);

export function step(name, promise) {
    // Every wait is bounded: a stuck step names itself instead of hanging the test.
    let timer;
    const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out: ${name}`)), STEP_MS);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// `url` is another homeserver's client API, for scenarios across servers.
export async function login(user, password, url = baseUrl) {
    const response = await fetch(`${url}/_matrix/client/v3/login`, {
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

// `session`: a login made beforehand ({user_id, device_id, access_token}), used instead of
// a new one (a test that places each device's token behind a load balancer).
export async function startDevice(user, password, url = baseUrl, session = null) {
    session ||= await login(user, password, url);
    const client = createClient({
        baseUrl: url,
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
    // Another device that shares a room key before these are up gets none: it withholds it.
    await step(`${session.device_id} one-time keys`, oneTimeKeysUploaded(session, url));
    return client;
}

export async function oneTimeKeysUploaded(session, url = baseUrl) {
    for (;;) {
        const response = await fetch(`${url}/_matrix/client/v3/keys/upload`, {
            method: "POST",
            headers: {
                "Content-Type": "application/json",
                Authorization: `Bearer ${session.access_token}`,
            },
            body: "{}",
        });
        if (!response.ok) throw new Error(`keys/upload: ${response.status}`);
        const counts = (await response.json()).one_time_key_counts || {};
        if (counts.signed_curve25519 > 0) return;
        await new Promise((resolve) => setTimeout(resolve, 50));
    }
}

// Resolves with an event's clear content once this client has decrypted it.
export function decrypted(client, roomId, eventId) {
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
export async function failureReason(client, roomId, eventId) {
    const event = client.getRoom(roomId)?.findEventById(eventId);
    if (!event) return "not in the timeline";
    await client.decryptEventIfNeeded(event);
    await event.getDecryptionPromise();
    return event.decryptionFailureReason;
}

export function joinedRoom(client, roomId) {
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

export function invited(client) {
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

// Resolves once `client` is invited to `roomId` (it may be in other rooms already).
export function invitedTo(client, roomId) {
    return new Promise((resolve) => {
        const check = () => {
            if (client.getRoom(roomId)?.getMyMembership() === "invite") {
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

// Resolves once `client`'s crypto lists `deviceId` among `userId`'s devices: the sender
// encrypts to the devices it knows, so it must have seen the new one first.
export function knowsDevice(client, userId, deviceId) {
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

export async function send(client, roomId, body) {
    const { event_id: eventId } = await client.sendMessage(roomId, { msgtype: "m.text", body });
    return eventId;
}

export function memberJoined(client, roomId, userId) {
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

// Runs a scenario: fn(scenario) resolves with the result to print.
export function main(fn) {
    fn(JSON.parse(scenarioJson)).then(
        (result) => {
            process.stdout.write(JSON.stringify(result) + "\n");
            process.exit(0);
        },
        (error) => {
            process.stdout.write(JSON.stringify({ error: String(error?.stack || error) }) + "\n");
            process.exit(1);
        },
    );
}
