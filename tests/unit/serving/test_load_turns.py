"""A device's load turns: a few loads side by side, one alone, first come first served."""

from __future__ import annotations

import asyncio

import pytest

from dlscale.serving.memory.turns import Turns


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_loads_of_known_size_run_up_to_the_width_side_by_side() -> None:
    turns = Turns(2)
    await turns.enter(False)
    await turns.enter(False)
    third = asyncio.ensure_future(turns.enter(False))
    await settle()
    assert turns.running == 2 and not third.done()
    turns.leave(False)
    await third
    assert turns.running == 2 and turns.entered == 3


async def test_a_load_alone_waits_for_the_others_and_later_ones_wait_behind_it() -> None:
    turns = Turns(4)
    await turns.enter(False)
    alone = asyncio.ensure_future(turns.enter(True))
    await settle()
    later = asyncio.ensure_future(turns.enter(False))  # would fit the width: it may not pass
    await settle()
    assert not alone.done() and not later.done()
    turns.leave(False)
    await alone
    await settle()
    assert turns.running == 1 and not later.done()
    turns.leave(True)
    await later
    assert turns.running == 1 and not turns.idle()
    turns.leave(False)
    assert turns.idle()


async def test_a_cancelled_waiter_lets_the_ones_behind_it_go() -> None:
    turns = Turns(2)
    await turns.enter(False)
    alone = asyncio.ensure_future(turns.enter(True))
    await settle()
    behind = asyncio.ensure_future(turns.enter(False))
    await settle()
    alone.cancel()
    await behind  # the load alone in front of it gave up: it fits beside the first
    assert turns.running == 2
    with pytest.raises(asyncio.CancelledError):
        await alone


def test_a_width_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="1 or more"):
        Turns(0)


async def test_a_turn_given_to_a_cancelled_load_is_handed_on() -> None:
    turns = Turns(1)
    await turns.enter(False)
    given = asyncio.ensure_future(turns.enter(False))
    await settle()
    turns.leave(False)  # the turn goes to `given`, which is cancelled before it runs
    given.cancel()
    with pytest.raises(asyncio.CancelledError):
        await given
    assert turns.running == 0 and turns.idle()
