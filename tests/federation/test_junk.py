"""Servers whose answers were mostly junk (homeserver/federation/junk.py), on a fake clock."""

from homeserver.federation.junk import REMEMBERED_SECONDS, JunkAnswers
from tests.support.federation import FakeClock


def test_a_server_whose_answer_was_mostly_junk_is_asked_last_for_a_while():
    clock = FakeClock()
    junk = JunkAnswers(clock)
    junk.note("good.test", held=20, useful=20)
    junk.note("half.test", held=20, useful=10)  # half is not mostly
    junk.note("bad.test", held=28_920, useful=20)
    assert not junk.is_junk("good.test") and not junk.is_junk("half.test")
    assert junk.is_junk("bad.test")
    assert junk.last(["bad.test", "good.test", "half.test"]) == [
        "good.test",
        "half.test",
        "bad.test",
    ]
    clock.advance(REMEMBERED_SECONDS + 1)
    assert not junk.is_junk("bad.test")


def test_an_empty_answer_is_no_junk():
    junk = JunkAnswers(FakeClock())
    junk.note("quiet.test", held=0, useful=0)
    assert not junk.is_junk("quiet.test")
