"""Many ten-step chains at once on DBOS, the shape of the cluster bench's
`many/N` rows: N workflows started at once by one process, each ten steps
in a line, each step returning a small object at once; every step's result
checkpointed in DBOS's SQLite system database before the next runs.

Run by hand, in a virtual environment of its own (see README.md here):

    python dbos_many.py 100 1000

prints, for each N, the steps per second from the first start to the last
result.
"""

import asyncio
import os
import sys
import tempfile
import time

from dbos import DBOS, DBOSConfig

STEPS = 10


@DBOS.step()
async def step(index: int) -> dict:
    return {"done": index}


@DBOS.workflow()
async def chain() -> int:
    for index in range(STEPS):
        await step(index)
    return STEPS


async def many(executions: int) -> float:
    started = time.perf_counter()
    handles = await asyncio.gather(*(DBOS.start_workflow_async(chain) for _ in range(executions)))
    results = await asyncio.gather(*(handle.get_result() for handle in handles))
    elapsed = time.perf_counter() - started
    assert results == [STEPS] * executions, "every workflow ran its ten steps"
    return elapsed


async def main(counts: list[int]) -> None:
    for executions in counts:
        elapsed = await many(executions)
        steps = executions * STEPS
        print(f"DBOS     many/{executions:<5} {steps:>6} steps {elapsed:>7.3f} s {steps / elapsed:>8.0f} steps/s")


if __name__ == "__main__":
    counts = [int(count) for count in sys.argv[1:]] or [100, 1000]
    with tempfile.TemporaryDirectory() as folder:
        config: DBOSConfig = {
            "name": "muster-peer-many",
            "system_database_url": f"sqlite:///{os.path.join(folder, 'dbos.sqlite')}",
        }
        DBOS(config=config)
        DBOS.launch()
        try:
            asyncio.run(main(counts))
        finally:
            DBOS.destroy()
