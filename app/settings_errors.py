"""Settings memproxy cannot use, said in the operator's words instead of pydantic's traceback.

Every command (and ``create_app`` when it reads the environment itself) builds its settings with
:func:`load_settings`: a bad value becomes one line per setting naming the variable as it is set
(``MEMPROXY_RECALL_LIMIT``), the value given (keys masked) and what is expected.
:func:`unknown_settings` names the ``MEMPROXY_`` variables that are no setting at all (pydantic
ignores them silently, so a misspelling would otherwise go unnoticed), with the closest real one.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from app.config import Settings
from app.log import mask_url

PREFIX = "MEMPROXY_"
PROJECT_VARIABLES = {
    "MEMPROXY_TEST_DATABASE_URL": "tests/databases.py: run the tests on this PostgreSQL server",
    "MEMPROXY_TEST_CHROMIUM": "tests/browser/conftest.py: the Chromium the page's tests drive",
    "MEMPROXY_SCREENSHOT_DIR": "tests/browser/conftest.py: where the page's screenshots go",
    "MEMPROXY_LLM_CACHE": "bench/llm_install.py: where the benchmarks' local models are kept",
}
"""The project's own ``MEMPROXY_`` variables, read by its tests and benchmarks: no setting of the
server, and no misspelling of one either (tests/test_config_cli.py checks the list is whole)."""
SECRET_WORDS = ("key", "secret", "password")
"""A setting whose name holds one of these has its value masked in messages."""


class ConfigError(Exception):
    """Start-up cannot go on; `lines` say why, one problem each (the CLI prints them, exits 2)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


def env_name(field: str) -> str:
    """The variable that sets `field`."""
    return PREFIX + field.upper()


def load_settings() -> Settings:
    """Settings from the environment and ``.env``; :class:`ConfigError` when a value is bad."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def settings_or_exit() -> Settings:
    """:func:`load_settings` for ``uvicorn --factory``, which would print a traceback: a bad
    setting ends the process with the lines on stderr and status 2."""
    try:
        return load_settings()
    except ConfigError as exc:
        # a misspelt name may be the very cause
        exit_start([*exc.lines, *(f"warning: {w}" for w in unknown_settings())])


def exit_start(lines: Sequence[str]) -> NoReturn:
    """End a start that cannot go on, before the server has printed anything (uvicorn runs the
    factory first): `lines` on stderr, each as ``memproxy: ...``, and status 2."""
    for line in lines:
        print(f"memproxy: {line}", file=sys.stderr)
    raise SystemExit(2)


def describe(exc: ValidationError) -> list[str]:
    """One line per bad setting: its variable, the value given and what it should be."""
    lines: list[str] = []
    seen: set[str] = set()
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        if field in seen:  # a list setting fails once per item: the operator needs one line
            continue
        seen.add(field)
        if field not in Settings.model_fields:
            lines.append(f"settings: {error['msg']}")
            continue
        lines.append(
            f"{env_name(field)} is {_shown(field, error['input'])}: {_expected(field, error)}"
        )
    return lines


def _shown(field: str, value: Any) -> str:
    if any(word in field for word in SECRET_WORDS):  # keys and secrets are never echoed
        return "'***' (hidden)"
    value = str(value)
    if field.endswith("_url"):  # a bad URL may still carry a password (or lack only its scheme)
        value = mask_url(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "...'"


def _expected(field: str, error: ErrorDetails) -> str:
    info = Settings.model_fields[field]
    annotation = info.annotation
    if get_origin(annotation) is Literal:
        return "expected one of " + ", ".join(str(choice) for choice in get_args(annotation))
    if annotation is bool:
        return "expected true or false"
    kind = {int: "an integer", float: "a number"}.get(annotation)  # type: ignore[arg-type]
    if kind is None:  # a validator's own words ("must start with http:// or https://")
        return str(error["msg"]).removeprefix("Value error, ")
    bounds = {
        name: getattr(item, name)
        for item in info.metadata
        for name in ("ge", "gt", "le", "lt")
        if hasattr(item, name)
    }
    if "ge" in bounds and "le" in bounds:
        return f"expected {kind} between {bounds['ge']:g} and {bounds['le']:g}"
    words = {"ge": "of at least", "gt": "greater than", "le": "of at most", "lt": "less than"}
    limits = " and ".join(f"{words[name]} {value:g}" for name, value in bounds.items())
    return f"expected {kind}" + (f" {limits}" if limits else "")


def unknown_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each ``MEMPROXY_`` variable, in the environment or the ``.env`` file, that
    is no setting, naming the closest one (variables of other programs, and the project's own,
    :data:`PROJECT_VARIABLES`, are not looked at)."""
    known = [name.upper() for name in Settings.model_fields]
    known += [name.removeprefix(PREFIX) for name in PROJECT_VARIABLES]
    given = {
        name.upper(): "the environment" for name in (os.environ if environ is None else environ)
    }
    env_file = Settings.model_config.get("env_file")
    if isinstance(env_file, str | Path) and Path(env_file).is_file():
        from dotenv import dotenv_values

        for name in dotenv_values(env_file):
            given.setdefault(name.upper(), str(env_file))
    warnings = []
    for name, where in sorted(given.items()):
        suffix = name.removeprefix(PREFIX)
        if not name.startswith(PREFIX) or suffix in known or not suffix:
            continue
        close = difflib.get_close_matches(suffix, known, n=1)
        hint = f"; did you mean {PREFIX + close[0]}?" if close else ""
        warnings.append(f"{name} (in {where}) is not a memproxy setting and is ignored{hint}")
    return warnings
