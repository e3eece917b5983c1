"""Federation transport: how this server calls others and knows their keys, and nothing of
rooms. Discovery, the one outbound client (IP filter, TLS, signing, caps, deadline),
X-Matrix signing, our signing key, the keyring, cool-downs, the outbound error taxonomy, and
the admission of client-triggered outbound calls (`admission.py`, ADR-0079)."""
