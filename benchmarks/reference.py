"""``reference_s``: a fixed pure-Python workload timed in the same run as a benchmark, so that
figures taken on different (or differently busy) machines can be compared: divide by it.

The workload is deterministic and touches what the project's hot paths do — dict and tuple
churn, sorting, float arithmetic — for about 0.2 s on a 2020s laptop core.
"""

import random
import statistics
import time


def _workload() -> float:
    rng = random.Random(0)
    table: dict[int, tuple[float, int]] = {}
    total = 0.0
    for i in range(200_000):
        key = rng.randrange(50_000)
        value, count = table.get(key, (0.0, 0))
        table[key] = (value + i * 0.5, count + 1)
    for value, count in sorted(table.values()):
        total += value / count
    return total


def reference_s(repeats: int = 3) -> float:
    """Median seconds of the workload over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        _workload()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 4)


if __name__ == "__main__":
    print(reference_s())
