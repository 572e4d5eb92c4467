"""Do idle sockets lock real clients out? (issue 23, point 5)

Starts memproxy as `memproxy serve` runs it (uvicorn with app.server's options, the default
MEMPROXY_MAX_CONNECTIONS unless `--max-connections`; a temporary SQLite database, a stub embedder,
no Manager, loopback) in a process of its own, then two attacks, each from a process of its own:

1. silent: `--silent` (1,050) sockets that connect and send nothing, each reopened as soon as the
   server closes it, for `--seconds` (30); meanwhile this process sends `--requests` (60) real
   requests (`GET /healthz`, each on a new connection, evenly spread over the time). Printed: how
   many got 200 / 503 / no answer, their latency p50 / p99, and how often the attacker reopened.
2. kept-alive: `--kept` (1,100) connections that each make one request (50 at a time) and then
   hold the connection open, sending nothing. Then a new connection asks `GET /healthz` every 100 ms
   until it gets a 200 (at most `--wait-max` seconds). Printed: the attacker's answers (200/503)
   and how many of its connections the server closed, the time the new client waited for its
   200 and the 503s it got on the way.

Target: no real request refused or left waiting because of idle connections.

`--app-root DIR` serves the `app` package found in DIR instead of this tree's: the code before a
change, e.g. `mkdir /tmp/head && git archive HEAD app | tar -x -C /tmp/head`.

Run: .venv/bin/python bench/idle_sockets.py [--silent 1050] [--requests 60] [--seconds 30]
     [--kept 1100] [--wait-max 30] [--max-connections N] [--app-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import free_port, pct, server  # noqa: E402

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
TIMEOUT = 15.0
"""How long one real request may take before it counts as not answered."""


def raise_file_limit() -> None:
    """Thousands of sockets need thousands of file descriptors: the soft limit up to the hard."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- the server --------------------------------------------------------------------------------


def serve(port: int, app_root: str) -> None:
    """memproxy under uvicorn with `memproxy serve`'s options (app.server.uvicorn_options)."""
    raise_file_limit()
    sys.path.insert(0, app_root)
    import numpy as np
    import uvicorn

    from app.config import Settings
    from app.main import create_app
    from app.server import uvicorn_options

    class StubEmbedder:  # /healthz embeds nothing; the model would only slow the start
        model_name = "stub"
        dim = 8

        async def embed(self, texts: Any) -> Any:
            return np.ones((len(texts), self.dim), dtype=np.float32) / np.sqrt(self.dim)

        async def embed_query(self, text: str) -> Any:
            return np.ones(self.dim, dtype=np.float32) / np.sqrt(self.dim)

        def close(self) -> None:
            pass

    settings = Settings()
    app = create_app(settings, embedder=StubEmbedder())
    options = uvicorn_options(settings) | {"log_level": "error"}
    uvicorn.run(app, host="127.0.0.1", port=port, **options)


# --- HTTP on raw sockets -----------------------------------------------------------------------


async def read_status(reader: asyncio.StreamReader) -> int:
    """The status of one response, whose body is read too."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def real_request(port: int) -> tuple[str, float]:
    """('200' / '503' / 'no answer', seconds) of one GET /healthz on a new connection."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(REQUEST)
                status = str(await read_status(reader))
            finally:
                writer.close()
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
        status = "no answer"
    return status, time.perf_counter() - started


# --- the attackers (each in a process of its own) ----------------------------------------------


def silent_attacker(port: int, sockets: int, report: Connection) -> None:
    raise_file_limit()
    report.send(asyncio.run(_silent(port, sockets, report)))


async def _silent(port: int, sockets: int, report: Connection) -> dict[str, int]:
    """Keeps `sockets` silent connections open until told to stop; what happened to them."""
    counts: Counter[str] = Counter()
    stop = asyncio.Event()
    up = 0
    ready = asyncio.Event()

    async def slot() -> None:
        nonlocal up
        first = True
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                counts["connect failed"] += 1
                await asyncio.sleep(0.05)
                continue
            if first:
                first = False
                up += 1
                if up == sockets:
                    ready.set()
            else:
                counts["reopened"] += 1
            closed = asyncio.ensure_future(reader.read(1))  # b"" (or a reset): closed by memproxy
            await asyncio.wait(
                [closed, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED"
            )
            closed.cancel()
            writer.close()

    tasks = [asyncio.create_task(slot()) for _ in range(sockets)]
    try:
        async with asyncio.timeout(30):
            await ready.wait()
    except TimeoutError:
        pass
    report.send(up)  # all connected (or as many as could be in 30 s): the real requests start
    started = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, report.recv)
    counts["seconds"] = round(time.monotonic() - started)
    stop.set()
    await asyncio.gather(*tasks)
    return dict(counts)


def kept_attacker(port: int, sockets: int, report: Connection) -> None:
    raise_file_limit()
    asyncio.run(_kept(port, sockets, report))


async def _kept(port: int, sockets: int, report: Connection) -> None:
    """Each connection: one request, then held open sending nothing until told to stop."""
    answers: Counter[str] = Counter()
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    gate = asyncio.Semaphore(50)  # a few at a time, as clients come: each is served, then idles

    async def one() -> None:
        try:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(REQUEST)
                answers[str(await read_status(reader))] += 1
            held.append((reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            answers["no answer"] += 1

    await asyncio.gather(*(one() for _ in range(sockets)))
    report.send(dict(answers))
    await asyncio.get_running_loop().run_in_executor(None, report.recv)  # the probe is done
    closed = sum(1 for reader, _ in held if reader.at_eof())
    for _, writer in held:
        writer.close()
    report.send(closed)


# --- the two runs ------------------------------------------------------------------------------


async def spread_requests(port: int, count: int, seconds: float) -> list[tuple[str, float]]:
    async def at(delay: float) -> tuple[str, float]:
        await asyncio.sleep(delay)
        return await real_request(port)

    return await asyncio.gather(*(at(i * seconds / count) for i in range(count)))


def silent_run(args: argparse.Namespace, port: int) -> None:
    here, there = multiprocessing.Pipe()
    attacker = multiprocessing.Process(target=silent_attacker, args=(port, args.silent, there))
    attacker.start()
    up = here.recv()
    started = time.monotonic()
    results = asyncio.run(spread_requests(port, args.requests, args.seconds))
    print(f"silent: {up} of {args.silent} sockets connected, then {args.requests} real requests "
          f"over {time.monotonic() - started:.1f} s")  # fmt: skip
    here.send("stop")
    counts = here.recv()
    attacker.join()
    seconds = max(1, counts.pop("seconds"))
    print(f"  the silent sockets: {counts.get('reopened', 0)} reopened after memproxy closed them "
          f"({counts.get('reopened', 0) / seconds:.0f}/s), "
          f"{counts.get('connect failed', 0)} connects failed")  # fmt: skip
    statuses = Counter(status for status, _ in results)
    answered = [seconds for status, seconds in results if status == "200"]
    print("  real requests: " + ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())))
    if answered:
        print(f"  200 latency: p50 {pct(answered, 0.5) * 1000:.0f} ms, "
              f"p99 {pct(answered, 0.99) * 1000:.0f} ms")  # fmt: skip


def kept_run(args: argparse.Namespace, port: int) -> None:
    here, there = multiprocessing.Pipe()
    attacker = multiprocessing.Process(target=kept_attacker, args=(port, args.kept, there))
    attacker.start()
    answers = here.recv()
    started = time.monotonic()
    refused: Counter[str] = Counter()
    status = ""
    while time.monotonic() - started < args.wait_max:
        status, _ = asyncio.run(real_request(port))
        if status == "200":
            break
        refused[status] += 1
        time.sleep(0.1)
    waited = time.monotonic() - started
    here.send("done")
    closed = here.recv()
    attacker.join()
    print(f"kept-alive: {args.kept} connections, one request each: "
          + ", ".join(f"{n} x {s}" for s, n in sorted(answers.items())))  # fmt: skip
    print(f"  then held open: {closed} of them closed by the server by the end of the probe")
    got = "200" if status == "200" else f"no 200 (last: {status})"
    refusals = ", ".join(f"{n} x {s}" for s, n in sorted(refused.items())) or "none"
    print(f"  a new client: {got} after {waited:.2f} s; refusals on the way: {refusals}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silent", type=int, default=1050, help="silent sockets, reopened")
    parser.add_argument("--requests", type=int, default=60, help="real requests meanwhile")
    parser.add_argument("--seconds", type=float, default=30.0, help="the silent attack's length")
    parser.add_argument("--kept", type=int, default=1100, help="kept-alive idle connections")
    parser.add_argument("--wait-max", type=float, default=30.0, help="the new client's patience")
    parser.add_argument("--max-connections", type=int, help="MEMPROXY_MAX_CONNECTIONS")
    parser.add_argument("--app-root", default=str(ROOT), help="folder holding the app package")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.app_root)
        return
    raise_file_limit()
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        env = {
            "MEMPROXY_DATABASE_URL": f"sqlite+aiosqlite:///{folder}/memproxy.db",
            "MEMPROXY_UPSTREAM_BASE_URL": "http://127.0.0.1:9/v1",  # never called
            "MEMPROXY_UPSTREAM_CHECK_AT_START": "false",
            "MEMPROXY_MANAGER_ENABLED": "false",
            "MEMPROXY_LOG_LEVEL": "ERROR",
        }
        if args.max_connections:
            env["MEMPROXY_MAX_CONNECTIONS"] = str(args.max_connections)
        command = [sys.executable, __file__, "--serve", str(port), "--app-root", args.app_root]
        cap = args.max_connections or "default"
        print(f"memproxy :{port} from {args.app_root}/app, MEMPROXY_MAX_CONNECTIONS={cap}; "
              "the attackers in processes of their own")  # fmt: skip
        with server(command, port, env):
            silent_run(args, port)
            time.sleep(2)  # the attacker's sockets gone
            kept_run(args, port)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
