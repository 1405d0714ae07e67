"""The client's event-loop helpers."""

from __future__ import annotations

import asyncio
import gc

from node.client import aio


def test_a_detached_task_is_held_until_it_ends_and_then_let_go():
    async def main() -> list:
        gate, seen = asyncio.Event(), []

        async def job() -> None:
            await gate.wait()
            seen.append("done")

        task = aio.detach(job())
        del task
        gc.collect()  # the loop's own reference is weak: only the helper's set keeps the task
        await asyncio.sleep(0)
        assert len(aio._DETACHED) == 1
        gate.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not aio._DETACHED
        return seen

    assert aio.run(main()) == ["done"]
