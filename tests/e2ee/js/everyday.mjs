// Element Web's everyday screens with matrix-js-sdk: the member list (joined_members), a
// report, a tag, then a ban, an unban and forgetting the room.
//
//   node everyday.mjs <homeserver URL> <scenario JSON>
//
// Every wait is on the SDK's events (or an answer); prints what the clients saw.
import { createClient, RoomEvent } from "matrix-js-sdk";
import { login, main, memberJoined, send, startDevice, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

// The rooms a fresh login's sync of left rooms (include_leave) brings, by ID.
async function leftRooms(user, password) {
    const session = await login(user, password);
    const client = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    return (await client.syncLeftRooms()).map((room) => room.roomId);
}

// Resolves once `client`'s view of `roomId` passes `check(room)`, with its value.
function roomShows(client, roomId, check, events) {
    return new Promise((resolve) => {
        const look = () => {
            const room = client.getRoom(roomId);
            const value = room && check(room);
            if (value) {
                for (const name of events) client.off(name, look);
                resolve(value);
            }
        };
        for (const name of events) client.on(name, look);
        look();
    });
}

function membershipOf(client, roomId, userId, membership) {
    return roomShows(
        client,
        roomId,
        (room) => room.getMember(userId)?.membership === membership,
        [RoomEvent.Timeline, RoomEvent.MyMembership],
    );
}

main(async ({ alice: a, bob: b, tag, reason }) => {
    const alice = await startDevice(a.user, a.password);
    const bob = await startDevice(b.user, b.password);
    const { room_id: roomId } = await alice.createRoom({ preset: "public_chat", name: "Lobby" });
    await bob.joinRoom(roomId);
    await step("alice sees bob joined", memberJoined(alice, roomId, bob.getUserId()));

    const members = await bob.getJoinedRoomMembers(roomId);

    const eventId = await send(alice, roomId, "something to report");
    await step(
        "bob's client has alice's message",
        roomShows(bob, roomId, (room) => room.findEventById(eventId), [RoomEvent.Timeline]),
    );
    const report = await bob.reportEvent(roomId, eventId, -100, reason);

    const tagged = roomShows(bob, roomId, (room) => room.tags[tag] && room, [RoomEvent.Tags]);
    await bob.setRoomTag(roomId, tag, { order: 0.5 });
    const room = await step("bob's sync brings the tag", tagged);
    const tags = room.tags;
    const tagAccountData = room.getAccountData("m.tag")?.getContent();

    await alice.ban(roomId, bob.getUserId(), "enough");
    await step("bob's client sees the ban", membershipOf(bob, roomId, bob.getUserId(), "ban"));
    await alice.unban(roomId, bob.getUserId());
    await step("alice sees the unban", membershipOf(alice, roomId, bob.getUserId(), "leave"));

    // Left rooms as a client that has never seen them asks for them (Element's "Historical"
    // list): a sync with include_leave. The forgotten room is in it before, not after.
    const leftBefore = await leftRooms(b.user, b.password);
    await bob.forget(roomId, true);
    const forgottenHere = bob.getRoom(roomId) === null;
    const leftAfter = await leftRooms(b.user, b.password);

    for (const client of [alice, bob]) client.stopClient();
    return {
        roomId,
        eventId,
        joined: Object.keys(members.joined).sort(),
        displayNames: Object.values(members.joined).map((m) => m.display_name ?? null),
        report,
        tags,
        tagAccountData,
        leftBeforeForget: leftBefore.includes(roomId),
        forgottenHere,
        leftAfterForget: leftAfter.includes(roomId),
    };
});
