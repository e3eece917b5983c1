"""The kernel every other package stands on: the clock, Matrix identifiers, errors and their
codes, the one strict JSON decoder, the Requester, the Event value, greenlet coordination by
key, a TTL cache, and `component` (a part of a composition root, built once). It imports
nothing from the rest of the server."""
