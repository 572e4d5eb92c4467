"""Whether the database driver a URL names is installed, said before anything tries to use it.

``postgresql+asyncpg://...`` needs asyncpg, which only the ``postgres`` extra installs: without it
SQLAlchemy fails deep in engine creation with a traceback. :func:`require_driver` imports the
driver first and raises :class:`MissingDriver` naming what to install.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError

from app.log import mask_url

EXTRAS = {"asyncpg": "memproxy[postgres]"}
"""The memproxy extra that installs a driver; any other driver is named as its own package."""


class MissingDriver(Exception):
    """The URL's driver (`module`) cannot be imported; `install` is what to run."""

    def __init__(self, module: str, install: str) -> None:
        super().__init__(f"needs the driver {module}, which is not installed: {install}")
        self.module = module
        self.install = install


def require_driver(url: str) -> None:
    """Import `url`'s driver; :class:`MissingDriver` when it (or its dialect) is not installed."""
    parsed = make_url(url)
    try:
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except NoSuchModuleError:
        module = parsed.get_driver_name() or parsed.get_backend_name()
        raise MissingDriver(module, f"pip install {module}") from None
    except ModuleNotFoundError as exc:
        module = (exc.name or parsed.get_driver_name()).split(".")[0]
        package = EXTRAS.get(module, module)
        raise MissingDriver(module, f"pip install '{package}'") from None


def missing_driver_line(url: str, source: str) -> str | None:
    """The one line to end a start with when `url`'s driver is missing (`source`: the setting or
    flag that gave the URL), else None."""
    try:
        require_driver(url)
    except MissingDriver as exc:
        return f"the database at {mask_url(url)} ({source}) {exc}"
    return None
