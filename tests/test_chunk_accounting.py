"""The chunk accounting a run's results give from the controller's books and the learners' own."""

from __future__ import annotations

from tianji_dask.run.accounting import chunk_accounting


def _books(granted: int, consumed: int, forgotten: int, unsubmitted: int = 0) -> dict:
    return {"credits_granted": granted, "chunks_consumed": consumed, "chunks_in_flight": 0,
            "credits_returned": {"consumed": consumed, "erred": 0, "forgotten": forgotten, "unsubmitted": unsubmitted}}


def test_chunks_a_learner_consumed_whose_bookings_were_cut_off_count_as_consumed_not_forgotten():
    # the learner's host cut off: it consumed 147, its last booking never reached the controller,
    # which saw that chunk's key forgotten with the worker
    a = chunk_accounting(_books(148, 146, forgotten=1, unsubmitted=1), learner_chunks=147)
    assert a["consumed"] == 147 and a["returned"] == {"consumed": 147, "erred": 0, "forgotten": 0, "unsubmitted": 1}
    assert a["balanced"] and a["consumed_not_heard"] == 1 and a["consumed_lost_with_learners"] == 0


def test_chunks_consumed_by_a_learner_lost_before_its_checkpoint_are_counted_and_nothing_is_moved():
    a = chunk_accounting(_books(150, 146, forgotten=4), learner_chunks=140)
    assert a["consumed"] == 146 and a["returned"]["forgotten"] == 4 and a["balanced"]
    assert a["consumed_lost_with_learners"] == 6 and a["consumed_not_heard"] == 0


def test_more_consumed_by_the_learners_than_the_controller_returned_stays_unexplained():
    a = chunk_accounting(_books(148, 146, forgotten=1, unsubmitted=1), learner_chunks=149)
    assert a["consumed"] == 146 and a["consumed_not_heard"] == 0 and a["consumed_lost_with_learners"] == -3
