"""The Matrix APIs as Flask blueprints, thin: parse, authenticate, call a service, answer.
`app.py` builds the app for a listener; `context.py`, `auth.py` and `federation_auth.py` give
a request its runtime, its user or its origin server."""
