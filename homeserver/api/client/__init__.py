"""Blueprints of the client-server API (/_matrix/client, /_matrix/media, /_synapse/admin)."""
