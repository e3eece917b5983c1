"""The server admins' services behind Synapse's admin API (api/client/admin_*.py)."""
