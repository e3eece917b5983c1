"""Blueprints of the server-server API (/_matrix/federation, /_matrix/key), each behind
X-Matrix authentication except the key server."""
