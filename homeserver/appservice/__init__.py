"""Application services: bridges registered by the operator (appservice/registration.py),
their tokens, namespaces and the transactions pushed to them (appservice/sender.py)."""
