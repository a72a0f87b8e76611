"""Ids (``duplex.protocol.ids``): session ids are random; event, item, response and call ids are a
per-process random prefix plus a counter (unique, not secret), all in one fixed format."""

from __future__ import annotations

import os
import re
import threading

import pytest

from duplex.protocol import ids

UNIQUE = [
    (ids.new_event_id, "event_"),
    (ids.new_item_id, "item_"),
    (ids.new_response_id, "resp_"),
    (ids.new_call_id, "call_"),
]


@pytest.mark.parametrize(("fn", "prefix"), UNIQUE)
def test_counter_ids_keep_the_format_and_never_repeat(fn, prefix: str) -> None:
    made = [fn() for _ in range(50_000)]
    assert len(set(made)) == len(made)
    pattern = re.compile(re.escape(prefix) + "[0-9a-f]{22}")
    assert all(pattern.fullmatch(i) for i in made)


def test_every_kind_shares_the_process_prefix_and_one_counter() -> None:
    made = [fn()[len(prefix) :] for fn, prefix in UNIQUE for _ in range(10)]
    assert len({m[: ids.PREFIX_HEX] for m in made}) == 1
    assert len(set(made)) == len(made)  # the counter part differs across kinds too


def test_ids_made_on_many_threads_at_once_never_repeat() -> None:
    out: list[list[str]] = [[] for _ in range(8)]

    def make(bucket: list[str]) -> None:
        bucket.extend(ids.new_event_id() for _ in range(20_000))

    threads = [threading.Thread(target=make, args=(bucket,)) for bucket in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [i for bucket in out for i in bucket]
    assert len(set(made)) == len(made) == 160_000


def test_the_counter_wraps_within_the_format() -> None:
    width = ids.COUNTER_HEX
    assert f"{(1 << (4 * width)) & ids._COUNTER_MASK:0{width}x}" == "0" * width


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_a_new_prefix() -> None:
    parent = ids.new_event_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        try:
            os.write(write, ids.new_event_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert re.fullmatch("event_[0-9a-f]{22}", child)
    assert child[6 : 6 + ids.PREFIX_HEX] != parent[6 : 6 + ids.PREFIX_HEX]


def test_session_ids_are_random_and_longer() -> None:
    made = {ids.new_session_id() for _ in range(2000)}
    assert len(made) == 2000
    assert all(re.fullmatch("sess_[0-9a-f]{24}", i) for i in made)
    # No shared prefix: each one is fresh randomness (a counter would share all but the tail).
    assert len({i[5:15] for i in made}) == 2000
