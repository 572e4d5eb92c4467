"""`memproxy fake-upstream`: the fake model server, saying where it listens once it does."""

from __future__ import annotations

import socket

import uvicorn

from app.devtools.fake_upstream import FakeUpstream


class _Announcing(uvicorn.Server):
    """A uvicorn server that prints one line once its socket is bound (not before: a port in
    use ends it with uvicorn's own error instead)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            url = f"http://{self.config.host}:{self.config.port}"
            print(f"fake upstream listening on {url} (OpenAI base URL: {url}/v1)", flush=True)


def serve(host: str, port: int) -> None:
    """Run :class:`FakeUpstream` on `host`:`port` until interrupted."""
    config = uvicorn.Config(
        FakeUpstream(), host=host, port=port, access_log=False, log_level="warning"
    )
    _Announcing(config).run()
