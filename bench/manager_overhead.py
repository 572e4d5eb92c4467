"""Does the Manager slow chats down? Streaming chats through two memproxies in one run: one
with the Manager on (a fake Manager server that takes 500 ms per decision, bench/fake_manager.py),
one with it off, alternating request by request. Both start with the same `--memories` (1,000)
memories of the user, so recall costs the same on both sides; every request is a new user
message, so each one queues a Manager job. Prints TTFB and total time (p50, p99) and on/off
ratios.

Target (issue 4): unchanged, the ratios within run-to-run noise of 1.0. Since issue 11 the job
is written before the answer's first byte, while the upstream thinks: `--think-ms` makes the
fake upstream wait that long before answering, as a model does before its first token (0, the
default, shows the write's whole cost; a local model takes 100 ms or more).

Run: .venv/bin/python bench/manager_overhead.py [--requests 200] [--delay-ms 500] [--think-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import urllib.request
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import MODELS, Connection, free_port, pct, seed, server  # noqa: E402

PACED = {"X-Fake-Chunks": "20", "X-Fake-Delay-Ms": "10"}


async def run(requests: int, on_port: int, off_port: int, think_ms: int) -> None:
    headers = {**PACED, "X-Fake-Hang-Ms": str(think_ms)} if think_ms else PACED
    on = Connection(on_port, "/v1/chat/completions", headers, vary=True)
    off = Connection(off_port, "/v1/chat/completions", headers, vary=True)
    for _ in range(10):
        await on.send()
        await off.send()
    samples: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    for _ in range(requests):
        samples["on"].append(await on.send())
        samples["off"].append(await off.send())
    ms = 1000
    print(f"{requests} streaming chats each (first token after {think_ms} ms, 20 tokens, 10 ms "
          "apart), alternating (ms)")  # fmt: skip
    print(f"  {'':12} {'TTFB p50':>9} {'p99':>7} {'total p50':>10} {'p99':>7}")
    for name in ("off", "on"):
        first = [s[0] for s in samples[name]]
        total = [s[1] for s in samples[name]]
        label = "manager " + name
        print(f"  {label:12} {pct(first, .5) * ms:9.2f} {pct(first, .99) * ms:7.2f} "
              f"{pct(total, .5) * ms:10.2f} {pct(total, .99) * ms:7.2f}")  # fmt: skip
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        ratios = [
            pct([s[i] for s in samples["on"]], q) / pct([s[i] for s in samples["off"]], q)
            for i in (0, 1)
        ]
        print(f"  on/off {name}: TTFB {ratios[0]:.2f}, total {ratios[1]:.2f}   (target: ~1.00)")


def stats(port: int) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/memories/stats", headers={"X-User-Id": "bench"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, object] = orjson.loads(response.read())
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--delay-ms", type=int, default=500)
    parser.add_argument("--memories", type=int, default=1000, help="the user's memories, each side")
    parser.add_argument("--think-ms", type=int, default=0, help="upstream's wait before answering")
    args = parser.parse_args()
    python = sys.executable
    up, manager, on, off = free_port(), free_port(), free_port(), free_port()
    uvicorn = [python, "-m", "uvicorn", "--no-access-log", "--log-level", "warning"]
    with tempfile.TemporaryDirectory() as folder:
        for name in ("on", "off"):  # the same memories on both sides: recall costs the same
            asyncio.run(seed(f"sqlite+aiosqlite:///{folder}/{name}.db", args.memories))
        common = {
            "MEMPROXY_UPSTREAM_BASE_URL": f"http://127.0.0.1:{up}/v1",
            "MEMPROXY_LOG_LEVEL": "WARNING",
            "MEMPROXY_EMBEDDING_CACHE_DIR": str(MODELS),
            "MEMPROXY_CONVERSATION_THRESHOLD": "1",
            "MEMPROXY_PROCESSING_INTERVAL": "0",
        }
        with (
            server([*uvicorn, "--factory", "app.devtools.fake_upstream:FakeUpstream",
                    "--port", str(up)], up, {}),
            server([*uvicorn, "bench.fake_manager:app", "--port", str(manager)], manager,
                   {"MANAGER_DELAY_MS": str(args.delay_ms)}),
            server([python, "-m", "app.cli", "serve", "--port", str(on)], on, {
                **common, "MEMPROXY_DATABASE_URL": f"sqlite+aiosqlite:///{folder}/on.db",
                "MEMPROXY_MANAGER_BASE_URL": f"http://127.0.0.1:{manager}/v1"}),
            server([python, "-m", "app.cli", "serve", "--port", str(off)], off, {
                **common, "MEMPROXY_DATABASE_URL": f"sqlite+aiosqlite:///{folder}/off.db",
                "MEMPROXY_MANAGER_ENABLED": "false"}),
        ):  # fmt: skip
            print(f"fake Manager answering in {args.delay_ms} ms; memproxy on :{on}, off :{off}")
            asyncio.run(run(args.requests, on, off, args.think_ms))
            on_stats = stats(on)
            made = int(str(on_stats["total"])) - args.memories
            print(f"manager on: {made} memories created by the Manager, jobs {on_stats['jobs']}")


if __name__ == "__main__":
    main()
