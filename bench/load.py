"""HTTP load from a process of its own (so the API server's CPU is not the load's): GET one URL in a loop.

``python -m bench.load --url URL --duration S --concurrency N`` prints one JSON object:
``{"ok", "errors", "seconds", "p50_ms", "p99_ms"}`` (``ok`` = responses with status 200).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp


async def _run(url: str, duration_s: float, concurrency: int) -> dict[str, float]:
    ok = errors = 0
    took: list[float] = []
    deadline = time.perf_counter() + duration_s

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal ok, errors
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                else:
                    errors += 1
            took.append((time.perf_counter() - start) * 1000)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url) as resp:  # warm-up, not counted
            await resp.read()
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    took.sort()
    return {"ok": ok, "errors": errors, "seconds": seconds,
            "p50_ms": statistics.median(took) if took else 0.0,
            "p99_ms": took[min(len(took) - 1, int(len(took) * 0.99))] if took else 0.0}


def main() -> None:
    """Load one URL over several concurrent connections for a fixed time; print counts and latency as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--duration", type=float, default=10.0, help="Seconds of load.")
    parser.add_argument("--concurrency", type=int, default=8, help="Connections in parallel.")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args.url, args.duration, args.concurrency))))


if __name__ == "__main__":
    main()
