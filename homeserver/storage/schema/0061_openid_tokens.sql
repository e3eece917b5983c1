-- OpenID tokens (client-server spec, "OpenID"): a user's proof of identity for a third
-- party, which asks us back over /_matrix/federation/v1/openid/userinfo. Stored hashed, as
-- access tokens are; each is valid until expires_ts.
CREATE TABLE openid_tokens (
    token_hash TEXT PRIMARY KEY,    -- SHA-256 of the token, hex
    user_id TEXT NOT NULL REFERENCES users(user_id),
    expires_ts BIGINT NOT NULL
);
CREATE INDEX openid_tokens_by_expiry ON openid_tokens (expires_ts);
