"""The kernel every other package stands on: the clock, Matrix identifiers, errors and their
codes, the one strict JSON decoder, the Requester, the Event value, greenlet coordination by
key, and a TTL cache. It imports nothing from the rest of the server."""
