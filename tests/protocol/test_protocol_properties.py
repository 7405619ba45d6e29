"""Property: any history, written, then duplicated, reordered, re-batched (two writers mixed)
and truncated, is recovered exactly up to the frontier the delivered messages justify.

The oracle (`simulate.justified`) works from the truth and the delivered messages directly,
without the Reader's machinery, so the two can disagree if the Reader is wrong.
"""


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.protocol import Antichain, Reader, Writer, collect
from changelake.simulate import justified, mangle, random_history, write
from tests.support.seeding import seeded

PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    updates=st.integers(0, 120),
    times=st.integers(1, 12),
    closed=st.booleans(),
    keep=st.sampled_from([1.0, 1.0, 0.9, 0.6, 0.3]),
    duplicate=st.floats(0, 1.5),
)
def test_reader_recovers_exactly_what_is_justified(
    seed: int, updates: int, times: int, closed: bool, keep: float, duplicate: float
) -> None:
    rng = seeded(seed)
    history = random_history(rng, updates=updates, times=times, closed=closed)
    streams = [write(history, batch_size=rng.randint(1, 9)),
               write(history, batch_size=rng.randint(1, 9), finish_every=2)]
    log = mangle(streams, rng, duplicate=duplicate, keep=keep)
    expected_updates, expected_frontier = justified(history.truth, log)
    got = collect(log)
    assert got.frontier.to_json() == expected_frontier
    assert sorted(got.updates) == sorted(expected_updates)
    times_out = [t for _, t, _ in got.updates]
    assert times_out == sorted(times_out)  # time order
    assert len(set(got.updates)) == len(got.updates)  # exactly once


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), cut=st.floats(0, 1))
def test_restored_reader_continues_identically(seed: int, cut: float) -> None:
    rng = seeded(seed)
    history = random_history(rng, updates=60, times=6)
    log = mangle([write(history, batch_size=4)], rng)
    split = int(len(log) * cut)
    first = Reader()
    out = [b for m in log[:split] for b in first.push(m)]
    second = Reader.restore(first.save())  # data are hashable Records: JSON-able round trip
    out += [b for m in log[split:] for b in second.push(m)]
    assert [u for batch, _ in out for u in batch] == collect(log).updates


@settings(max_examples=150, deadline=None)
@given(
    changes=st.lists(
        st.tuples(st.sampled_from("abcd"), st.tuples(st.integers(0, 3), st.integers(0, 3)),
                  st.sampled_from([-1, 1, 2])),
        max_size=40,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_pair_times_recover_the_consolidated_history(changes: list, seed: int) -> None:
    rng = seeded(seed)
    writer = Writer(batch_size=3, since=Antichain([(0, 0)]))
    writer.extend(changes)
    messages = writer.advance_to(Antichain([(0, 2), (2, 0)])) + writer.close()
    log = mangle([messages], rng, duplicate=1.0)
    got = collect(log, since=Antichain([(0, 0)]))
    expected: dict = {}
    for d, t, r in changes:
        expected[(d, t)] = expected.get((d, t), 0) + r
    assert got.frontier == Antichain()
    assert sorted(got.updates) == sorted((d, t, r) for (d, t), r in expected.items() if r)
    # a linear extension of the product order: nothing follows an update at a greater time
    for i, (_, t1, _) in enumerate(got.updates):
        for _, t2, _ in got.updates[:i]:
            assert not (t1 != t2 and all(a <= b for a, b in zip(t1, t2, strict=True)))


def test_the_oracle_is_not_trivially_satisfied() -> None:
    """Guard: a truncated log really does hold the frontier back in these generators."""
    rng = seeded(11)
    history = random_history(rng, updates=100, times=8)
    log = mangle([write(history)], rng, keep=0.3)
    updates, frontier = justified(history.truth, log)
    assert frontier != [] and len(updates) < len(history.truth)
