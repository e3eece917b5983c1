"""Rooms as signed events: room versions, PDU building and redaction, the auth rules,
createRoom, send, membership and history visibility; and the checking of PDUs and
transactions that other servers send (`pdu_checks.py`, `transactions.py`)."""
