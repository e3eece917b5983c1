// Element's registration with a token, through matrix-js-sdk's InteractiveAuth: the flow is
// m.login.registration_token then m.login.dummy; the token is checked first at the validity
// endpoint, as Element's token field does, then submitted; the SDK does the dummy stage.
//
//   node registration_token.mjs <homeserver URL> <scenario JSON>
//
// The scenario names a one-use token and two usernames: the first registers, the second is
// refused at the token stage. Prints the stages each saw, the errors and the validities.
import { AuthType, ClientPrefix, createClient, InteractiveAuth, Method } from "matrix-js-sdk";
import { main, step } from "./harness.mjs";

const [baseUrl] = process.argv.slice(2);

async function valid(client, token) {
    const path = "/register/m.login.registration_token/validity";
    const answer = await client.http.request(Method.Get, path, { token }, undefined, {
        prefix: ClientPrefix.V1,
    });
    return answer.valid;
}

// Registers `username`, answering the token stage with `token`; resolves with the response,
// or with the error the server gave at a stage (the user would be shown it).
function register(client, username, password, token, stages) {
    let refused;
    const stopped = new Promise((resolve) => (refused = resolve));
    const auth = new InteractiveAuth({
        matrixClient: client,
        doRequest: (authDict) =>
            client.registerRequest({ username, password, auth: authDict ?? undefined }),
        stateUpdated: (stage, status) => {
            stages.push(stage);
            if (status.errcode) refused({ refused: status.errcode });
            else if (stage === AuthType.RegistrationToken) {
                auth.submitAuthDict({ type: AuthType.RegistrationToken, token });
            }
        },
        requestEmailToken: () => Promise.reject(new Error("no email stage expected")),
    });
    return Promise.race([auth.attemptAuth(), stopped]);
}

main(async ({ token, first, second, password }) => {
    const client = createClient({ baseUrl });
    const before = await step("validity", valid(client, token));
    const firstStages = [];
    const registered = await step("register", register(client, first, password, token, firstStages));
    const after = await step("validity after", valid(client, token));
    const secondStages = [];
    const refused = await step(
        "register again",
        register(createClient({ baseUrl }), second, password, token, secondStages),
    );
    return {
        before,
        after,
        user_id: registered.user_id,
        has_token: Boolean(registered.access_token),
        first_stages: firstStages,
        second: refused,
        second_stages: secondStages,
    };
});
