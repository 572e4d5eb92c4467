"""Settings from the environment, and the `memproxy` command line."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import ValidationError

from app import cli, settings_errors
from app.config import ApiKey, Settings
from app.main import create_app


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


def test_help_reads_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "memproxy: run the memory proxy" in out
    with pytest.raises(SystemExit):
        cli.main(["fake-upstream", "--help"])
    assert "listen port (default 9000)" in capsys.readouterr().out


def test_keys_are_never_echoed_in_a_bad_setting() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(manager_api_key=12345678, port="x")  # type: ignore[arg-type]
    lines = settings_errors.describe(raised.value)
    assert sorted(lines) == [  # in the fields' order: the Manager's come first (a base class)
        "MEMPROXY_MANAGER_API_KEY is '***' (hidden): Input should be a valid string",
        "MEMPROXY_PORT is 'x': expected an integer between 1 and 65535",
    ]


def test_create_app_from_the_environment_warns_of_misspellings_and_exits_on_bad_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    memproxy_logger = logging.getLogger("memproxy")
    memproxy_logger.addHandler(handler)
    try:
        monkeypatch.setenv("MEMPROXY_MANAGER_ENABLD", "false")
        create_app()
        create_app(Settings())  # settings given: the environment is not the app's to judge
    finally:
        memproxy_logger.removeHandler(handler)
    assert [(r.levelname, r.getMessage()) for r in records] == [
        (
            "WARNING",
            "MEMPROXY_MANAGER_ENABLD (in the environment) is not a memproxy setting and is "
            "ignored; did you mean MEMPROXY_MANAGER_ENABLED?",
        )
    ]
    # `uvicorn --factory app.main:create_app` would print a traceback: the lines and status 2.
    monkeypatch.setenv("MEMPROXY_DENSE_WEIGHT", "heavy")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        create_app()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "memproxy: MEMPROXY_DENSE_WEIGHT is 'heavy': expected a number between 0 and 1",
        "memproxy: warning: MEMPROXY_MANAGER_ENABLD (in the environment) is not a memproxy "
        "setting and is ignored; did you mean MEMPROXY_MANAGER_ENABLED?",
    ]


def test_exports_named_the_earlier_way_are_removed_once_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Exports used to be named by the model's path and size (12 hex digits); a new export
    removes them (~90 MB each), and nothing else of the cache folder."""
    from app.memory.search import embedder, onnx_model

    monkeypatch.setattr(onnx_model, "_export", lambda source, target, quantize: target.touch())
    name = Path(embedder.bundled_model_path()).name
    old = [tmp_path / f"{name}-0123456789ab-fp32.onnx", tmp_path / f"{name}-0123456789ab-int8.onnx"]
    kept = [
        tmp_path / "other-0123456789ab-fp32.onnx",
        tmp_path / f"{name}-0123456789abcdef-fp32.onnx",
    ]
    for path in old + kept:
        path.touch()
    files = onnx_model.prepare(embedder.bundled_model_path(), str(tmp_path), quantize=False)
    assert files.onnx.exists()
    assert not any(path.exists() for path in old)  # both, whichever variant was exported
    assert all(path.exists() for path in kept)


def test_first_start_says_one_line_per_model_export(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make run` printed the same "exporting ... (once)" twice: fp32 and int8 are two exports."""
    from app.memory.search import embedder, onnx_model

    def export(source: Path, target: Path, quantize: bool) -> None:  # a whole one, manifest too
        target.write_bytes(b"onnx")
        target.with_suffix(".json").write_text('{"dim": 4, "max_tokens": 8, "onnx_bytes": 4}')

    monkeypatch.setattr(onnx_model, "_export", export)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    onnx_model.logger.addHandler(handler)
    onnx_model.logger.setLevel(logging.INFO)
    try:
        for _ in range(2):  # the second time, both files are there: nothing is said
            for quantize in (False, True):
                onnx_model.prepare(embedder.bundled_model_path(), str(tmp_path), quantize=quantize)
    finally:
        onnx_model.logger.removeHandler(handler)
        onnx_model.logger.setLevel(logging.NOTSET)
    messages = [r.getMessage() for r in records]
    assert len(messages) == 2 and len(set(messages)) == 2
    assert "fp32 (once)" in messages[0] and "int8 (once)" in messages[1]


def test_the_projects_own_variables_are_not_warned_about() -> None:
    """The tests' and the benchmarks' own ``MEMPROXY_`` variables are no setting and no typo:
    every one read under tests/ or bench/ is in the one list, and only a real misspelling warns."""
    root = Path(__file__).resolve().parent.parent
    read = {
        name
        for folder in ("tests", "bench")
        for path in (root / folder).rglob("*.py")
        for name in re.findall(r"environ(?:\.get)?[\[(]\"(MEMPROXY_\w+)\"", path.read_text())
    }
    own = read - {f"MEMPROXY_{name.upper()}" for name in Settings.model_fields}
    assert {"MEMPROXY_TEST_CHROMIUM", "MEMPROXY_LLM_CACHE"} <= own
    assert own <= set(settings_errors.PROJECT_VARIABLES), own
    environ = {name: "x" for name in own} | {"MEMPROXY_TEST_CHROMIUMM": "x"}
    assert settings_errors.unknown_settings(environ) == [
        "MEMPROXY_TEST_CHROMIUMM (in the environment) is not a memproxy setting and is ignored;"
        " did you mean MEMPROXY_TEST_CHROMIUM?"
    ]
