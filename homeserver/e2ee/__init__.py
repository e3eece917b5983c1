"""End-to-end encryption support: the server stores and relays what clients encrypt with,
never decrypts. Device keys, one-time and fallback keys and their claims (keys.py),
cross-signing keys and signatures (cross_signing.py), signature checks (signatures.py),
devices (devices.py), to-device messages (to_device.py) and the parts of /sync they add
(sync_part.py), and server-side key backups (key_backup.py).

Across servers: our users' keys as other servers see them and the EDUs that tell them of
changes (federation.py), other servers' users' keys for our clients under ADR-0079
(remote_keys.py), and other servers' EDUs, with the cache of their users' device lists
(inbound_edus.py).
"""
