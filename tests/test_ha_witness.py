"""The pair's witness on a real Redis: who may become primary, who may go on
alone, and that of a standby taking over and a primary dropping it exactly
one wins."""

from __future__ import annotations

import time

import pytest

from broker.ha.witness import Term, Witness, WitnessRefused, WitnessUnreachable
from rig.processes import RedisServer, free_port

LEASE = 0.3


@pytest.fixture
def witness(redis_server: RedisServer) -> Witness:
    made = Witness(redis_server.url, lease_seconds=LEASE, timeout=1.0)
    made.bind("7300000000000000001")
    return made


def lapse() -> None:
    time.sleep(LEASE + 0.1)


def refused(call: object, *args: object, **kwargs: object) -> WitnessRefused:
    with pytest.raises(WitnessRefused) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def test_the_first_grant_opens_the_next_epoch_and_holds_the_lease(witness: Witness) -> None:
    assert witness.begin("A", epoch=4, takeover=False) == 5
    assert witness.term() == Term(epoch=5, primary="A", standby="", holder="A")
    no = refused(witness.begin, "B", epoch=5, takeover=False)
    assert no.reason == "lease"
    assert "A holds the lease of epoch 5" in no.detail


def test_a_synchronous_standby_takes_over_once_the_lease_lapsed(witness: Witness) -> None:
    witness.begin("A", epoch=1, takeover=False)
    witness.renew("A", epoch=2, standby="B")
    assert refused(witness.begin, "B", epoch=2, takeover=True).reason == "lease"
    lapse()
    assert witness.begin("B", epoch=2, takeover=True) == 3
    # The old primary's next renewal is refused: it steps down.
    assert refused(witness.renew, "A", epoch=2, standby="B").reason == "lease"
    lapse()
    assert refused(witness.renew, "A", epoch=2, standby="B").reason == "superseded"


def test_a_standby_the_primary_went_on_without_never_takes_over(witness: Witness) -> None:
    witness.begin("A", epoch=1, takeover=False)
    witness.renew("A", epoch=2, standby="B")
    witness.renew("A", epoch=2, standby="")  # the primary goes on alone
    lapse()
    no = refused(witness.begin, "B", epoch=2, takeover=True)
    assert no.reason == "not-synchronous"
    assert "waits for no standby, not for this node" in no.detail


def test_of_a_takeover_and_a_drop_exactly_one_wins(witness: Witness) -> None:
    """The cut between the nodes: each finds the other silent and asks the
    witness; in either order one is refused."""
    witness.begin("A", epoch=1, takeover=False)
    witness.renew("A", epoch=2, standby="B")
    lapse()
    assert witness.begin("B", epoch=2, takeover=True) == 3
    assert refused(witness.renew, "A", epoch=2, standby="").reason == "lease"

    witness.bind("7300000000000000002")
    witness.begin("A", epoch=1, takeover=False)
    witness.renew("A", epoch=2, standby="B")
    lapse()
    witness.renew("A", epoch=2, standby="")
    assert refused(witness.begin, "B", epoch=2, takeover=True).reason == "lease"


def test_a_store_behind_the_witness_is_not_made_primary(witness: Witness) -> None:
    """A former primary restarted after the standby took over (and stopped):
    its store lacks the newer epoch's writes."""
    witness.begin("A", epoch=4, takeover=False)
    witness.renew("A", epoch=5, standby="B")
    lapse()
    witness.begin("B", epoch=5, takeover=True)
    lapse()
    no = refused(witness.begin, "A", epoch=5, takeover=False)
    assert no.reason == "behind"
    assert "B has been primary since epoch 6" in no.detail
    # A takeover from a term this standby has not seen is refused too.
    assert refused(witness.begin, "A", epoch=5, takeover=True).reason == "behind"


def test_a_released_lease_lets_the_peer_in_at_once(witness: Witness) -> None:
    witness.begin("A", epoch=1, takeover=False)
    witness.release("B")  # not B's: nothing happens
    assert witness.term().holder == "A"
    witness.release("A")
    assert witness.term().holder == ""
    assert witness.begin("B", epoch=2, takeover=False) == 3


def test_a_witness_that_lost_its_keys_is_filled_again_by_the_primary(witness: Witness) -> None:
    witness.begin("A", epoch=1, takeover=False)
    witness.bind("7300000000000000003")  # as if Redis restarted empty
    witness.renew("A", epoch=2, standby="B")
    assert witness.term() == Term(epoch=2, primary="A", standby="B", holder="A")


def test_two_pairs_in_one_redis_do_not_meet(redis_server: RedisServer) -> None:
    one = Witness(redis_server.url, lease_seconds=LEASE, timeout=1.0)
    other = Witness(redis_server.url, lease_seconds=LEASE, timeout=1.0)
    one.bind("1")
    other.bind("2")
    one.begin("A", epoch=0, takeover=False)
    assert other.begin("A", epoch=0, takeover=False) == 1
    assert refused(other.begin, "B", epoch=1, takeover=False).reason == "lease"


def test_an_unreachable_witness_grants_nothing() -> None:
    gone = Witness(f"redis://127.0.0.1:{free_port()}/0", lease_seconds=LEASE, timeout=0.5)
    gone.bind("1")
    with pytest.raises(WitnessUnreachable, match=r"the witness \(redis 127.0.0.1:\d+/0\)"):
        gone.begin("A", epoch=0, takeover=False)
    unbound = Witness(f"redis://127.0.0.1:{free_port()}/0", lease_seconds=LEASE, timeout=0.5)
    with pytest.raises(WitnessUnreachable, match="not bound"):
        unbound.renew("A", epoch=1, standby="")
