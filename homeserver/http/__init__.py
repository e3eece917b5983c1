"""The web layer under the APIs: the gevent server and its handler, the media handoff, the
client hang-up watch, request-context middleware, JSON parsing and Matrix error responses.
It knows WSGI and Flask, never a service."""
