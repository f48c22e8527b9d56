"""The held leases' bookkeeping: what a renewal may judge lapsed (app/cluster/held.py)."""

from __future__ import annotations

import threading
import time

from app.cluster.held import Held


def test_a_lease_the_renewal_did_not_extend_lapses_and_is_forgotten() -> None:
    held = Held()
    held.add(1)
    held.add(2)
    asked = held.marks()
    assert held.lapsed(asked, renewed={1}) == {2}
    assert 1 in held and 2 not in held and len(held) == 1


def test_a_lease_taken_while_the_renewal_ran_is_not_judged() -> None:
    held = Held()
    held.add(1)
    asked = held.marks()
    held.add(2)  # claimed after the renewal looked: its UPDATE did not ask about it
    assert held.lapsed(asked, renewed={1}) == set()
    assert sorted(held) == [1, 2]


def test_a_lease_given_back_and_taken_anew_while_the_renewal_ran_is_not_lost() -> None:
    held = Held()
    held.add(1)
    asked = held.marks()
    held.discard(1)  # given back (idle): the renewal's UPDATE found no row ...
    held.add(1)  # ... and taken again by a message before it was judged
    assert held.lapsed(asked, renewed=set()) == set()
    assert 1 in held


def test_a_lease_given_back_while_the_renewal_ran_is_not_reported_lapsed() -> None:
    held = Held()
    held.add(1)
    asked = held.marks()
    held.discard(1)
    assert held.lapsed(asked, renewed=set()) == set()


def test_iterating_while_another_thread_changes_it() -> None:
    held = Held()
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            held.add(n % 50)
            held.discard((n + 25) % 50)
            n += 1

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(5):
            for _cid in held:  # never "changed size during iteration"
                time.sleep(0)  # (the other thread runs meanwhile)
    finally:
        stop.set()
        thread.join()
