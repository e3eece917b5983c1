"""One mapping from an outbound failure to its metrics outcome, for every client-triggered call."""

import pytest

from budget import DeadlineExceeded
from homeserver.federation.admission import failure_outcome
from homeserver.federation.errors import (
    AddressCoolingDown,
    DestinationUnreachable,
    MalformedResponse,
    RemoteError,
    ResponseTooLarge,
)
from homeserver.media.files import FileTooLarge


@pytest.mark.parametrize(
    "error, outcome",
    [
        (DeadlineExceeded(10, 10.1), "deadline"),
        (AddressCoolingDown("p.test", "127.0.0.1:8448", 30, True), "cooling_down"),
        (DestinationUnreachable("p.test", "refused"), "unreachable"),
        (RemoteError("p.test", 500), "remote_error"),
        (ResponseTooLarge("p.test", 10), "too_large"),
        (FileTooLarge("over 10 bytes"), "too_large"),
        (MalformedResponse("p.test", "not JSON"), "malformed"),
        (ValueError("ours"), "error"),
    ],
)
def test_failure_outcomes(error, outcome):
    assert failure_outcome(error) == outcome
