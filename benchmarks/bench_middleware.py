"""Time added per instrumented tool call: instrumented minus bare, sync and async, same run.

The emitter is pointed at a sink that discards batches so the figure is the caller's cost
(building and queueing two events), which is what the agent pays; delivery happens on the
emitter's thread. Medians over many rounds of ``--calls`` calls each, interleaving bare and
instrumented rounds so machine noise hits both alike.

    python benchmarks/bench_middleware.py [--rounds 200] [--calls 2000]
"""

import argparse
import asyncio
import json
import statistics
import time

import maitred
from maitred.middleware import EmitterSettings


class NullSink:
    def send(self, events) -> None:
        pass

    def close(self) -> None:
        pass


def bare(x: int) -> int:
    return x + 1


async def abare(x: int) -> int:
    return x + 1


def per_call_us(fn, calls: int) -> float:
    began = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - began) / calls * 1e6


async def aper_call_us(fn, calls: int) -> float:
    began = time.perf_counter()
    for i in range(calls):
        await fn(i)
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    maitred.configure(sinks=[NullSink()], settings=EmitterSettings(max_queue=1_000_000, batch_size=10_000))
    inst, ainst = maitred.tool(bare), maitred.tool(abare)
    added_sync, added_async = [], []
    loop = asyncio.new_event_loop()
    with maitred.program("bench", agent="bench"):
        for _ in range(args.rounds):
            added_sync.append(per_call_us(inst, args.calls) - per_call_us(bare, args.calls))
            added_async.append(
                loop.run_until_complete(aper_call_us(ainst, args.calls))
                - loop.run_until_complete(aper_call_us(abare, args.calls))
            )
    loop.close()
    maitred.shutdown()
    result = {"added_us_sync": round(statistics.median(added_sync), 2), "added_us_async": round(statistics.median(added_async), 2)}
    print(f"rounds={args.rounds} calls/round={args.calls}; p90 sync {statistics.quantiles(added_sync, n=10)[-1]:.2f} us, "
          f"p90 async {statistics.quantiles(added_async, n=10)[-1]:.2f} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
