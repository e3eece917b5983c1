// Element's account settings through matrix-js-sdk: a password change (setPassword with the
// current password as its user-interactive auth), an OpenID token for a widget
// (getOpenIdToken), TURN credentials for a call (turnServer), and deactivation
// (deactivateAccount with erase).
//
//   node account.mjs <homeserver URL> <scenario JSON>
//
// Prints what each step answered, what the federation listener said of the OpenID token,
// and what a login with the old and the new password got.
import { createClient } from "matrix-js-sdk";
import { login, main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function loginStatus(user, password) {
    try {
        await login(user, password);
        return "ok";
    } catch (error) {
        // harness.login throws "login <user>: <status> <body>".
        const [, status, body] = /: (\d+) (.*)$/s.exec(String(error.message));
        return `${status} ${JSON.parse(body).errcode}`;
    }
}

const passwordAuth = (user, password) => ({
    type: "m.login.password",
    identifier: { type: "m.id.user", user },
    password,
});

// What the federation listener says of an OpenID token, as a widget's server would ask it.
async function userinfo(federationUrl, token) {
    const url = `${federationUrl}/_matrix/federation/v1/openid/userinfo`;
    const response = await fetch(`${url}?access_token=${encodeURIComponent(token)}`);
    return { status: response.status, body: await response.json() };
}

main(async ({ alice: a, new_password: newPassword, federation_url: federationUrl }) => {
    const session = await login(a.user, a.password);
    const alice = createClient({
        baseUrl,
        userId: session.user_id,
        deviceId: session.device_id,
        accessToken: session.access_token,
    });
    let wrong;
    try {
        await alice.setPassword(passwordAuth(a.user, "not it"), newPassword);
    } catch (error) {
        wrong = { status: error.httpStatus, errcode: error.errcode, flows: error.data?.flows };
    }
    await step("setPassword", alice.setPassword(passwordAuth(a.user, a.password), newPassword));
    const afterChange = {
        old: await loginStatus(a.user, a.password),
        new: await loginStatus(a.user, newPassword),
    };
    const openid = await step("getOpenIdToken", alice.getOpenIdToken());
    const vouched = await step("userinfo", userinfo(federationUrl, openid.access_token));
    const turn = await step("turnServer", alice.turnServer());
    const deactivated = await step(
        "deactivateAccount",
        alice.deactivateAccount(passwordAuth(a.user, newPassword), true),
    );
    return {
        user_id: alice.getUserId(),
        wrong,
        after_change: afterChange,
        openid,
        vouched,
        turn,
        deactivated,
        after_deactivation: await loginStatus(a.user, newPassword),
    };
});
