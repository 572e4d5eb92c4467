"""Settings from the environment, and the `memproxy` command line."""

from __future__ import annotations

import os
from typing import Any

import pytest
import uvicorn
from pydantic import ValidationError

from app import cli
from app.config import ApiKey, Settings


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMPROXY_UPSTREAM_BASE_URL", "https://api.example.com/v1/")
    monkeypatch.setenv("MEMPROXY_API_KEYS", "sk-1, sk-2:alice ,")
    monkeypatch.setenv("MEMPROXY_USER_ID_HEADERS", "X-Remote-User,X-User-Id")
    monkeypatch.setenv("MEMPROXY_REQUIRE_USER", "true")
    settings = Settings()
    assert settings.upstream_base_url == "https://api.example.com/v1"
    assert settings.parsed_api_keys == (ApiKey("sk-1", None), ApiKey("sk-2", "alice"))
    assert settings.user_id_headers == ["X-Remote-User", "X-User-Id"]
    assert settings.require_user is True


def test_settings_from_env_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("MEMPROXY_PORT=9123\nMEMPROXY_MODELS_CACHE_SECONDS=0\n")
    monkeypatch.chdir(tmp_path)
    settings = Settings(_env_file=".env")
    assert (settings.port, settings.models_cache_seconds) == (9123, 0)


def test_defaults_and_bad_values() -> None:
    settings = Settings()
    assert settings.upstream_base_url == "http://localhost:11434/v1"
    assert settings.api_keys == [] and settings.max_body_bytes >= 32 * 1024 * 1024
    with pytest.raises(ValidationError):
        Settings(upstream_base_url="localhost:11434")
    with pytest.raises(ValidationError):
        Settings(port=0)


def test_every_setting_is_documented_in_env_example() -> None:
    from pathlib import Path

    example = (Path(__file__).parent.parent / ".env.example").read_text()
    for name in Settings.model_fields:
        assert f"MEMPROXY_{name.upper()}=" in example, name


def test_serve_command_runs_the_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    monkeypatch.setenv("MEMPROXY_PORT", "8111")
    monkeypatch.setenv("MEMPROXY_HOST", "127.0.0.1")  # restored after the test: serve sets it
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 0
    app, options = calls[0]
    assert app == "app.main:create_served_app" and options["factory"] is True
    assert (options["host"], options["port"]) == ("0.0.0.0", 8111)
    # The app builds its Settings from the environment: the flag is there for its start-up lines.
    assert os.environ["MEMPROXY_HOST"] == "0.0.0.0"
    monkeypatch.setenv("MEMPROXY_HOST", "127.0.0.1")
    cli.main(["serve", "--port", "9999"])
    assert calls[1][1]["port"] == 9999 and calls[1][1]["host"] == "127.0.0.1"
    assert os.environ["MEMPROXY_PORT"] == "9999"


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "serve" in out and "fake-upstream" in out
