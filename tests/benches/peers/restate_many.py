"""Many ten-step chains at once on Restate, the shape of the cluster
bench's `many/N` rows: N invocations of a handler started at once by one
client (through Restate's HTTP ingress), each ten `ctx.run` steps in a
line returning a small object at once, every step journaled by the
single-node server before the next runs.

Run by hand, in a virtual environment of its own, with the server from
npm (see README.md here):

    python restate_many.py --server PATH/TO/restate-server 100 1000

It starts the server in a temporary folder and the service (hypercorn, in
this process), registers the service, and prints, for each N, the steps
per second from the first request sent to the last answer.
"""

import argparse
import asyncio
import subprocess
import tempfile
import time

import httpx
import hypercorn.asyncio
import hypercorn.config
import restate

STEPS = 10
SERVICE_PORT = 9080
INGRESS = "http://127.0.0.1:8080"
ADMIN = "http://127.0.0.1:9070"

chain_service = restate.Service("Chain")


@chain_service.handler()
async def run(ctx: restate.Context) -> int:
    for index in range(STEPS):
        await ctx.run("step", lambda index=index: {"done": index})
    return STEPS


async def until_up(client: httpx.AsyncClient, url: str) -> None:
    for _ in range(300):
        try:
            if (await client.get(url)).status_code < 500:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in 30 s")


async def many(client: httpx.AsyncClient, executions: int) -> float:
    started = time.perf_counter()
    answers = await asyncio.gather(*(client.post(f"{INGRESS}/Chain/run") for _ in range(executions)))
    elapsed = time.perf_counter() - started
    failed = [answer for answer in answers if answer.status_code != 200 or answer.json() != STEPS]
    assert not failed, f"{len(failed)} invocations failed: {failed[0].status_code} {failed[0].text}"
    return elapsed


async def main(server: str, counts: list[int]) -> None:
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{SERVICE_PORT}"]
    config.h2_max_concurrent_streams = 10_000
    config.loglevel = "WARNING"
    shutdown = asyncio.Event()
    service = asyncio.create_task(
        hypercorn.asyncio.serve(restate.app(services=[chain_service]), config, shutdown_trigger=shutdown.wait)
    )
    with tempfile.TemporaryDirectory() as folder:
        process = subprocess.Popen(
            [server, "--base-dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            limits = httpx.Limits(max_connections=max(counts), max_keepalive_connections=max(counts))
            async with httpx.AsyncClient(timeout=600, limits=limits) as client:
                await until_up(client, f"{ADMIN}/health")
                registered = await client.post(
                    f"{ADMIN}/deployments", json={"uri": f"http://127.0.0.1:{SERVICE_PORT}"}
                )
                registered.raise_for_status()
                await many(client, 10)  # warm: connections, the service's first calls
                for executions in counts:
                    elapsed = await many(client, executions)
                    steps = executions * STEPS
                    print(
                        f"Restate  many/{executions:<5} {steps:>6} steps {elapsed:>7.3f} s"
                        f" {steps / elapsed:>8.0f} steps/s"
                    )
        finally:
            process.terminate()
            process.wait()
            shutdown.set()
            await service


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="the restate-server binary")
    parser.add_argument("counts", nargs="*", type=int, default=[100, 1000])
    arguments = parser.parse_args()
    asyncio.run(main(arguments.server, arguments.counts))
