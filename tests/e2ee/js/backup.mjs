// Cross-signing and key backup, as Element sets them up, with matrix-js-sdk's Rust crypto.
//
//   node backup.mjs <homeserver URL> <scenario JSON>
//
// Alice bootstraps cross-signing (user-interactive auth with her password) and a key backup;
// bob sees her devices signed by her identity. Alice sends in an encrypted room; her room key
// reaches the backup; a new device of hers, given the backup key (as a user types a recovery
// key), restores it and reads the history. Prints one JSON line on stdout.
import { Method } from "matrix-js-sdk";
import { CryptoEvent } from "matrix-js-sdk/lib/crypto-api/index.js";

import {
    decrypted,
    failureReason,
    invited,
    joinedRoom,
    knowsDevice,
    main,
    send,
    startDevice,
    step,
} from "./harness.mjs";

async function bootstrapCrossSigning(client, password) {
    await client.getCrypto().bootstrapCrossSigning({
        setupNewCrossSigning: true,
        // As Element does: ask for the flows first, then answer with the session given.
        authUploadDeviceSigningKeys: async (makeRequest) => {
            try {
                await makeRequest(null);
                return;
            } catch (error) {
                if (error.httpStatus !== 401 || !error.data?.session) throw error;
                const identifier = { type: "m.id.user", user: client.getUserId() };
                const auth = { type: "m.login.password", identifier, password };
                await makeRequest({ ...auth, session: error.data.session });
            }
        },
    });
}

// Resolves with the backed-up sessions of a room once the server holds at least one.
async function backedUp(client, roomId, version) {
    const path = `/room_keys/keys/${encodeURIComponent(roomId)}`;
    for (;;) {
        const drained = new Promise((resolve) => {
            const onRemaining = (remaining) => {
                if (remaining !== 0) return;
                client.off(CryptoEvent.KeyBackupSessionsRemaining, onRemaining);
                resolve();
            };
            client.on(CryptoEvent.KeyBackupSessionsRemaining, onRemaining);
        });
        const held = await client.http.authedRequest(Method.Get, path, { version });
        if (Object.keys(held.sessions || {}).length) return held.sessions;
        await client.getCrypto().checkKeyBackupAndEnable(); // (re)starts the upload loop
        await drained;
    }
}

main(async ({ alice: a, bob: b, messages }) => {
    const result = {};
    const alice = await startDevice(a.user, a.password);
    const bob = await startDevice(b.user, b.password);
    const crypto = alice.getCrypto();

    await step("cross-signing", bootstrapCrossSigning(alice, a.password));
    result.cross_signing_ready = await crypto.isCrossSigningReady();
    await step("key backup", crypto.resetKeyBackup());
    // Read back from the server: the version, and whether its signatures make it trusted.
    const check = await crypto.checkKeyBackupAndEnable();
    const version = check?.backupInfo?.version;
    const active = await crypto.getActiveSessionBackupVersion();
    result.backup = { version, active, trusted: check?.trustInfo?.trusted };

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
    await step("bob invited", invited(bob));
    await bob.joinRoom(roomId);
    // Bob, sharing a room with alice, downloads her identity: her master and self-signing
    // keys, and her device's signature by the self-signing key (POST /keys/signatures/upload).
    const aliceId = alice.getUserId();
    await step("bob knows alice's device", knowsDevice(bob, aliceId, alice.getDeviceId()));
    result.bob_sees = {
        cross_signing_keys: await bob.getCrypto().userHasCrossSigningKeys(aliceId, true),
        signed_by_owner: (
            await bob.getCrypto().getDeviceVerificationStatus(aliceId, alice.getDeviceId())
        )?.signedByOwner,
    };

    const eventId = await send(alice, roomId, messages.history);
    const sessions = await step("room key backed up", backedUp(alice, roomId, version));
    result.backed_up_sessions = Object.keys(sessions).length;

    // A new device of alice's: the backup key is all it is given.
    const alice2 = await startDevice(a.user, a.password);
    await step("alice2 sees the room", joinedRoom(alice2, roomId));
    result.before_restore = await step("alice2 fails", failureReason(alice2, roomId, eventId));
    const key = await crypto.getSessionBackupPrivateKey();
    await alice2.getCrypto().storeSessionBackupPrivateKey(key, version);
    await alice2.getCrypto().checkKeyBackupAndEnable();
    const restored = await step("restore", alice2.getCrypto().restoreKeyBackup());
    result.restored = { total: restored.total, imported: restored.imported };
    result.history = (await step("alice2 decrypts", decrypted(alice2, roomId, eventId))).body;
    result.event_id = eventId;
    result.room_id = roomId;
    for (const client of [alice, bob, alice2]) client.stopClient();
    return result;
});
