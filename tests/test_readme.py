"""The README's curl and Python examples, run as written against memproxy and the fake upstream."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.servers import serve_stack

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", README, re.S)
CURLS = [code for lang, code in BLOCKS if lang == "bash" and code.lstrip().startswith("curl")]
CURL = [code for code in CURLS if "/v1/memories" not in code]
MEMORY_CURL = [code for code in CURLS if "/v1/memories" in code]
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
EXAMPLE_URL = "http://localhost:8000"


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    with serve_stack() as stack:
        yield stack.proxy_url


def test_readme_has_the_examples() -> None:
    assert README.startswith("# memproxy\n\n```bash\nmake run")
    assert len(CURL) == 3 and len(PYTHON) == 1 and len(MEMORY_CURL) == 3


@pytest.mark.parametrize("code", CURL, ids=["chat", "stream", "models"])
def test_curl_examples(proxy_url: str, code: str) -> None:
    assert EXAMPLE_URL in code
    done = subprocess.run(["bash", "-c", code.replace(EXAMPLE_URL, proxy_url)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    if "/models" in code:
        assert "fake-model" in done.stdout
    elif '"stream": true' in code:
        events = [line[6:] for line in done.stdout.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        deltas = [orjson.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
        assert "".join(deltas) == "echo: Hello!"
    else:
        assert orjson.loads(done.stdout)["choices"][0]["message"]["content"] == "echo: Hello!"


def test_python_example(proxy_url: str) -> None:
    code = PYTHON[0].replace(EXAMPLE_URL, proxy_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["echo: I live in Oslo.", "echo: Tell me a story."]


def run_curl(code: str, proxy_url: str) -> str:
    assert EXAMPLE_URL in code
    done = subprocess.run(["bash", "-c", code.replace(EXAMPLE_URL, proxy_url)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_memory_examples_in_order(proxy_url: str) -> None:
    """Add, search, list: each answers as the README implies (the fake embedder stands in)."""
    add, search, listing = MEMORY_CURL
    created = orjson.loads(run_curl(add, proxy_url))
    assert created["object"] == "memory" and created["user_id"] == "alice"
    found = orjson.loads(run_curl(search, proxy_url))["data"]
    assert [m["id"] for m in found] == [created["id"]] and found[0]["score"] > 0
    listed = orjson.loads(run_curl(listing, proxy_url))
    assert [m["id"] for m in listed["data"]] == [created["id"]] and listed["total"] == 1
