// Push rules and unread counts as Element uses them, through matrix-js-sdk.
//
//   node push.mjs <homeserver URL> <scenario JSON>
//
// bob adds a content rule, disables it and deletes it (addPushRule, setPushRuleEnabled,
// deletePushRule), each change read back with getPushRules and seen in his synced
// m.push_rules. alice sends two messages to their room: bob's getUnreadNotificationCount()
// reaches 2; a message mentioning him makes the highlight count 1; his read receipt on it
// clears both. Prints what bob's client saw.
import { ClientEvent, createClient, NotificationCountType, RoomEvent } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function started(user, password) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    const synced = new Promise((resolve) => {
        client.on(ClientEvent.Sync, (state) => state === "PREPARED" && resolve());
    });
    await client.startClient({ initialSyncLimit: 10 });
    await step(`${user} first sync`, synced);
    return client;
}

// Resolves once `check()` holds, looked at after every sync and count change.
function until(client, name, check) {
    return step(
        name,
        new Promise((resolve) => {
            const look = () => {
                if (!check()) return;
                client.off(ClientEvent.Sync, look);
                client.off(RoomEvent.UnreadNotifications, look);
                client.off(ClientEvent.AccountData, look);
                resolve();
            };
            client.on(ClientEvent.Sync, look);
            client.on(RoomEvent.UnreadNotifications, look);
            client.on(ClientEvent.AccountData, look);
            look();
        }),
    );
}

const contentRule = (rules) => rules.global.content.find((r) => r.rule_id === "tulips");
const synced = (client) => contentRule(client.pushRules ?? { global: { content: [] } });

main(async ({ alice: a, bob: b }) => {
    const alice = await started(a.user, a.password);
    const bob = await started(b.user, b.password);

    const rules = {};
    await bob.addPushRule("global", "content", "tulips", { pattern: "tulip", actions: ["notify"] });
    rules.added = contentRule(await bob.getPushRules()) ?? null;
    await until(bob, "synced rule", () => synced(bob)?.enabled === true);
    await bob.setPushRuleEnabled("global", "content", "tulips", false);
    rules.disabled = contentRule(await bob.getPushRules()) ?? null;
    await until(bob, "synced disable", () => synced(bob)?.enabled === false);
    await bob.deletePushRule("global", "content", "tulips");
    rules.deleted = contentRule(await bob.getPushRules()) ?? null;
    await until(bob, "synced delete", () => synced(bob) === undefined);

    const { room_id: roomId } = await alice.createRoom({ preset: "public_chat" });
    await bob.joinRoom(roomId);
    const counts = () => {
        const room = bob.getRoom(roomId);
        return {
            total: room?.getUnreadNotificationCount() ?? -1,
            highlight: room?.getUnreadNotificationCount(NotificationCountType.Highlight) ?? -1,
        };
    };
    const seen = [];
    const text = (body, extra = {}) => ({ msgtype: "m.text", body, ...extra });
    await alice.sendMessage(roomId, text("first"));
    await alice.sendMessage(roomId, text("second"));
    await until(bob, "two unread", () => counts().total === 2);
    seen.push(counts());
    const mention = { "m.mentions": { user_ids: [bob.getUserId()] } };
    const { event_id: mentionId } = await alice.sendMessage(roomId, text("bob?", mention));
    await until(bob, "a highlight", () => counts().highlight === 1);
    seen.push(counts());

    await until(bob, "the mention arrives", () => bob.getRoom(roomId)?.findEventById(mentionId));
    await bob.sendReadReceipt(bob.getRoom(roomId).findEventById(mentionId));
    await until(bob, "read", () => counts().total === 0 && counts().highlight === 0);
    seen.push(counts());
    alice.stopClient();
    bob.stopClient();
    return { rules, seen };
});
