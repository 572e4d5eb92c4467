"""HTTPS upstreams and Managers whose certificate a private CA signed (a CA made here, trustme):
without a setting, a 502 (and a Manager failure) naming the failed certificate check and the
setting; MEMPROXY_UPSTREAM_CA_FILE trusts that CA; MEMPROXY_UPSTREAM_VERIFY=false checks nothing
and says so at start; a CA file memproxy cannot use stops the start, naming the setting."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from pydantic_ai import models

from app import settings_errors
from app.config import Settings
from app.devtools.fake_upstream import FakeUpstream
from app.main import create_app
from app.memory.learning.decisions import Op
from app.memory.learning.manager import (
    Manager,
    ManagerUnavailable,
    build_http_client,
)
from app.memory.learning.turns import turn
from tests.fakes import FakeEmbedder
from tests.helpers import assert_openai_error, chat_body, running
from tests.servers import serve


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    """A CA no trust store knows, and its certificate as a PEM file."""
    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, ca_file


@pytest.fixture(scope="module")
def https_upstream(
    private_ca: tuple[trustme.CA, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The fake upstream over HTTPS on loopback, its certificate signed by the private CA."""
    ca, _ = private_ca
    pem = tmp_path_factory.mktemp("server") / "server.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(pem))
    with serve(FakeUpstream(), ssl_certfile=str(pem), ssl_keyfile=str(pem)) as url:
        assert url.startswith("https://")
        yield f"{url}/v1"


@pytest.fixture
def allow_model_requests() -> Iterator[None]:
    """The Manager's tests talk to a real (loopback) server: let pydantic-ai send."""
    models.ALLOW_MODEL_REQUESTS = True
    yield
    models.ALLOW_MODEL_REQUESTS = False


def settings_for(upstream_url: str, **overrides: Any) -> Settings:
    overrides.setdefault("manager_enabled", False)
    overrides.setdefault("upstream_check_at_start", False)
    return Settings(upstream_base_url=upstream_url, **overrides)


async def chat(settings: Settings) -> httpx.Response:
    app = create_app(settings, embedder=FakeEmbedder())
    async with running(app) as client:
        return await client.post("/v1/chat/completions", json=chat_body("hello over TLS"))


async def test_an_untrusted_upstream_certificate_is_a_502_naming_the_check(
    https_upstream: str,
) -> None:
    response = await chat(settings_for(https_upstream))
    error = assert_openai_error(response, 502)
    assert error["code"] == "upstream_unreachable"
    assert "TLS certificate verification failed" in error["message"]
    assert "MEMPROXY_UPSTREAM_CA_FILE" in error["message"]
    assert https_upstream in error["message"]


async def test_the_ca_file_makes_the_upstream_trusted(
    https_upstream: str, private_ca: tuple[trustme.CA, Path]
) -> None:
    _, ca_file = private_ca
    response = await chat(settings_for(https_upstream, upstream_ca_file=str(ca_file)))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


async def test_verify_false_reaches_the_upstream_and_warns_at_start(
    https_upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="memproxy"):
        response = await chat(settings_for(https_upstream, upstream_verify=False))
    assert response.status_code == 200, response.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith("MEMPROXY_UPSTREAM_VERIFY=false: ") for w in warnings), warnings


async def test_verify_on_is_not_warned(
    https_upstream: str, private_ca: tuple[trustme.CA, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, ca_file = private_ca
    with caplog.at_level(logging.WARNING, logger="memproxy"):
        await chat(settings_for(https_upstream, upstream_ca_file=str(ca_file)))
    assert not any("UPSTREAM_VERIFY" in r.getMessage() for r in caplog.records)


async def decide(settings: Settings) -> list[Any] | None:
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    exchange = [turn("user", "Remember that I play chess."), turn("assistant", "Noted.")]
    async with build_http_client(settings) as http:
        return await Manager(settings, http_client=http).decide(
            "m", memories=[], context=[], new=exchange, now=now
        )


@pytest.mark.usefixtures("allow_model_requests")
async def test_the_manager_names_an_untrusted_certificate(https_upstream: str) -> None:
    settings = settings_for(https_upstream, manager_max_retries=0)
    with pytest.raises(ManagerUnavailable) as raised:
        await decide(settings)
    message = str(raised.value)
    assert message.startswith(f"manager at {https_upstream} (model m): TLS certificate verif")
    assert "MEMPROXY_UPSTREAM_CA_FILE" in message


@pytest.mark.usefixtures("allow_model_requests")
@pytest.mark.parametrize("trust", ["ca_file", "verify_false"])
async def test_the_manager_reaches_a_private_ca_server_when_told(
    https_upstream: str, private_ca: tuple[trustme.CA, Path], trust: str
) -> None:
    _, ca_file = private_ca
    setting = (
        {"upstream_ca_file": str(ca_file)} if trust == "ca_file" else {"upstream_verify": False}
    )
    operations = await decide(settings_for(https_upstream, manager_max_retries=0, **setting))
    assert operations is not None
    assert [(o.op, o.content) for o in operations] == [(Op.NEW, "The user plays chess")]


def test_a_missing_ca_file_stops_the_start_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # a short value: the message shortens long ones
    missing = "nope.pem"
    monkeypatch.setenv("MEMPROXY_UPSTREAM_CA_FILE", missing)
    with pytest.raises(settings_errors.ConfigError) as raised:
        settings_errors.load_settings()
    assert raised.value.lines == [
        f"MEMPROXY_UPSTREAM_CA_FILE is '{missing}': cannot read it (No such file or directory)"
    ]
    with pytest.raises(SystemExit) as exit_:  # `uvicorn --factory app.main:create_app`
        create_app()
    assert exit_.value.code == 2
    assert "MEMPROXY_UPSTREAM_CA_FILE" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"not a certificate\n"], ids=["empty", "garbage"])
def test_a_ca_file_without_certificates_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_bytes(content)
    monkeypatch.setenv("MEMPROXY_UPSTREAM_CA_FILE", str(bad))
    with pytest.raises(settings_errors.ConfigError) as raised:
        settings_errors.load_settings()
    assert raised.value.lines == [
        f"MEMPROXY_UPSTREAM_CA_FILE is '{bad}': expected a PEM file of CA certificates"
    ]


def test_a_directory_as_ca_file_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMPROXY_UPSTREAM_CA_FILE", str(tmp_path))
    with pytest.raises(settings_errors.ConfigError) as raised:
        settings_errors.load_settings()
    assert raised.value.lines == [
        f"MEMPROXY_UPSTREAM_CA_FILE is '{tmp_path}': cannot read it (Is a directory)"
    ]
