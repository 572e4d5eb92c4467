"""Does one big chat stall everyone else? A probe's `/healthz` latency while a 50 MB chat goes by.

Starts the fake upstream, the fake Manager (bench/fake_manager.py) and memproxy (one uvicorn
worker each, separate processes, loopback; memproxy on a temporary database holding `--memories`
memories of the user, relevance threshold 0 so that every chat injects and re-serialises the
body, conversation threshold 1 so that every chat with memory on queues a Manager job). Then, in
this process, a probe process GETs `/healthz` every 10 ms on a keep-alive connection while the
main thread posts one big chat at a time, for each body shape and `X-Memory` mode:

- shapes: `text` (one user message of `--mb` MB), `history` (a conversation of ~500-byte turns
  adding up to `--mb` MB), `image` (a short question and a base64 data-URI image of `--mb` MB);
- modes: `on` (recall, inject, queue a Manager job), `read-only` (recall and inject), `off`.

A second probe GETs a do-nothing server (a process of its own) the same way: its max while
the big request is in flight (`control`), and after it (`then`), is about what the machine
alone adds then (the client, the fake upstream and memproxy share its cores). A spike in
memproxy's column with none in the control's is memproxy's; one in both may be the machine's
(the two maxima need not be at the same moment). The control runs beside every row, so it adds
its own small load to each.

Printed per run: the probe's max and p99 latency while the big request was in flight, and
after it: `--tail` seconds, or with memory on until the Manager has done the chat's job (the
Manager's own work on a 50 MB turn), next to the same figures with no big request at all.
Target (issue 11): no probe waits more than tens of ms.

Bounded: each big request gives up after `--timeout` seconds (a stall that long is the finding).

Run: .venv/bin/python bench/loop_stall.py [--mb 50] [--shapes text,history,image]
     [--modes off,read-only,on] [--tail 3] [--memories 1000]
     (LOGLEVEL=INFO in the environment: memproxy's log, on this process's stderr)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import MODELS, free_port, pct, seed, server, wait_listening  # noqa: E402

PROBE_EVERY = 0.010
MODES = ("off", "read-only", "on")
SHAPES = ("text", "history", "image")


def body(shape: str, megabytes: int, tag: str) -> bytes:
    """A chat of about `megabytes` MB; `tag` makes each one new to the Manager's fingerprints."""
    size = megabytes * 1024 * 1024
    system = {"role": "system", "content": "You are a helpful assistant."}
    if shape == "text":
        messages = [system, {"role": "user", "content": f"{tag} " + "tell me more " * (size // 13)}]
    elif shape == "history":
        turn = "lorem ipsum dolor sit amet consectetur " * 12
        messages = [system] + [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} {i} {turn}"}
            for i in range(size // 500)
        ]
        messages.append({"role": "user", "content": f"{tag}: and what do you make of all that?"})
    else:
        image = base64.b64encode(os.urandom(size * 3 // 4)).decode()
        content = [
            {"type": "text", "text": f"{tag}: what is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        ]
        messages = [system, {"role": "user", "content": content}]
    return orjson.dumps({"model": "fake-model", "stream": True, "messages": messages})


class Probe:
    """GET /healthz every PROBE_EVERY seconds from a process of its own (this one's work on 50 MB
    bodies would otherwise delay it); keeps (sent at, latency) of every probe."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".probe")  # noqa: SIM115
        self.process = multiprocessing.get_context("fork").Process(
            target=_probe, args=(port, self.log.name), daemon=True
        )

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)
        self.log.close()

    def between(self, start: float, end: float) -> list[float]:
        """Latencies of probes in flight at any moment of [start, end]."""
        self.log.seek(0)
        samples = [tuple(map(float, line.split())) for line in self.log if line.endswith("\n")]
        return [lat for sent, lat in samples if sent <= end and sent + lat >= start]


def _control(port: int) -> None:
    """A do-nothing HTTP/1.1 server: 200 "ok" to every request on a keep-alive connection."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()

    async def serve() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(serve())


def _probe(port: int, path: str) -> None:
    # time.perf_counter() is CLOCK_MONOTONIC on Linux: the same clock in every process.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    with open(path, "a") as log:
        while True:
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"/healthz answered {response.status}")
            log.write(f"{started} {time.perf_counter() - started}\n")
            log.flush()
            time.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - started)))


def post(port: int, data: bytes, mode: str, timeout: float) -> tuple[int, str]:
    """Send one streaming chat, read the whole answer; (status, X-Memories-Injected)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nX-User-Id: bench\r\nX-Memory: {mode}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        sock.sendall(head)
        sock.sendall(data)
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    finally:
        sock.close()
    status_line, _, rest = bytes(reply).partition(b"\r\n")
    headers = rest.split(b"\r\n\r\n", 1)[0].lower()
    injected = "-"
    for line in headers.split(b"\r\n"):
        if line.startswith(b"x-memories-injected:"):
            injected = line.split(b":", 1)[1].strip().decode()
    return int(status_line.split()[1]), injected


def jobs_pending(port: int) -> bool:
    """Whether the user `bench` has Manager jobs awaiting, queued or running."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v1/memories/stats", headers={"X-User-Id": "bench"})
        jobs = orjson.loads(conn.getresponse().read())["jobs"]
    finally:
        conn.close()
    return any(jobs.get(state) for state in ("awaiting", "queued", "running"))


def figures(latencies: list[float]) -> str:
    if not latencies:
        return f"{'-':>8} {'-':>8} {0:>6}"
    return f"{max(latencies) * 1000:8.1f} {pct(latencies, 0.99) * 1000:8.1f} {len(latencies):6}"


def run(args: argparse.Namespace, port: int) -> None:
    probe = Probe(port)
    control_port = free_port()
    control_server = multiprocessing.get_context("fork").Process(
        target=_control, args=(control_port,), daemon=True
    )
    control_server.start()
    wait_listening(control_port, seconds=10)
    control = Probe(control_port)
    probe.start()
    control.start()
    time.sleep(1.0)  # warm-up
    quiet_start = time.perf_counter()
    time.sleep(args.quiet)
    quiet = probe.between(quiet_start, time.perf_counter())
    print(f"{args.mb} MB chats; probe GET /healthz every {PROBE_EVERY * 1000:.0f} ms (latency ms)")
    print(f"  {'':18} {'request':>9} {'max':>8} {'p99':>8} {'probes':>6}   "
          f"{'then max':>8} {'p99':>8} {'probes':>6}   {'control':>7} {'then':>7}")  # fmt: skip
    calm = max(control.between(quiet_start, quiet_start + args.quiet), default=0.0)
    print(f"  {'no big request':18} {'':>9} {figures(quiet)}   {'':27}{calm * 1000:7.1f}")
    for shape in args.shapes:
        for mode in args.modes:
            data = body(shape, args.mb, f"{shape}-{mode}-{time.time_ns()}")
            started = time.perf_counter()
            try:
                status, injected = post(port, data, mode, args.timeout)
                outcome = f"{status}"
            except OSError as exc:
                outcome, injected = type(exc).__name__, "-"
            ended = time.perf_counter()
            time.sleep(args.tail)
            deadline = ended + args.timeout
            while mode == "on" and jobs_pending(port) and time.perf_counter() < deadline:
                time.sleep(0.2)
            during = probe.between(started, ended)
            machine = max(control.between(started, ended), default=0.0)
            now = time.perf_counter()
            tail = probe.between(ended, now)
            machine_then = max(control.between(ended, now), default=0.0)
            label = f"{shape}, {mode}"
            took = f"{outcome} {ended - started:4.1f}s"
            print(f"  {label:18} {took:>9} {figures(during)}   {figures(tail)}"
                  f"   {machine * 1000:7.1f} {machine_then * 1000:7.1f}   injected {injected}",
                  flush=True)  # fmt: skip
    probe.stop()
    control.stop()
    control_server.terminate()
    control_server.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50, help="size of each big chat body")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES)
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES)
    )
    parser.add_argument("--tail", type=float, default=3.0, help="seconds watched after each")
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds of baseline probing")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up on a big request")
    parser.add_argument("--memories", type=int, default=1000, help="the user's memories")
    args = parser.parse_args()
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.modes = [m for m in args.modes.split(",") if m]
    python = sys.executable
    up, manager, proxy = free_port(), free_port(), free_port()
    uvicorn = [python, "-m", "uvicorn", "--no-access-log", "--log-level", "warning"]
    with tempfile.TemporaryDirectory() as folder:
        database = f"sqlite+aiosqlite:///{folder}/memproxy.db"
        if args.memories:
            asyncio.run(seed(database, args.memories))
        env = {
            "MEMPROXY_UPSTREAM_BASE_URL": f"http://127.0.0.1:{up}/v1",
            "MEMPROXY_MANAGER_BASE_URL": f"http://127.0.0.1:{manager}/v1",
            "MEMPROXY_LOG_LEVEL": os.environ.get("LOGLEVEL", "WARNING"),
            "MEMPROXY_DATABASE_URL": database,
            "MEMPROXY_EMBEDDING_CACHE_DIR": str(MODELS),
            "MEMPROXY_RELEVANCE_THRESHOLD": "0",
            "MEMPROXY_CONVERSATION_THRESHOLD": "1",
            "MEMPROXY_PROCESSING_INTERVAL": "0",
            "MEMPROXY_MAX_BODY_BYTES": str((args.mb + 8) * 1024 * 1024),
        }
        with (
            server([*uvicorn, "--factory", "app.devtools.fake_upstream:FakeUpstream",
                    "--port", str(up)], up, {}),
            server([*uvicorn, "bench.fake_manager:app", "--port", str(manager)], manager,
                   {"MANAGER_DELAY_MS": "50"}),
            server([python, "-m", "app.cli", "serve", "--port", str(proxy)], proxy, env),
        ):  # fmt: skip
            run(args, proxy)


if __name__ == "__main__":
    main()
