"""End-to-end encryption support: the server stores and relays what clients encrypt with,
never decrypts. Device keys, one-time and fallback keys and their claims (keys.py),
cross-signing keys and signatures (cross_signing.py), signature checks (signatures.py),
devices (devices.py), to-device messages (to_device.py) and the parts of /sync they add
(sync_part.py), and server-side key backups (key_backup.py).

Federation (remote users' keys, device lists and to-device messages) is not here yet: the
services split local from remote users, and each marks where the remote half goes.
"""
