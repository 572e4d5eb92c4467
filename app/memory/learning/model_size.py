"""How big the Manager's model is: whether it gets the two-step Manager (``auto``).

``MEMPROXY_MANAGER_STEPS=auto`` gives the two-step Manager (:mod:`app.memory.learning.staged`)
to a model of at most ``MEMPROXY_MANAGER_SMALL_MODEL_BILLIONS`` billion parameters, and the
one-call Manager to any other. The size is read, in this order:

- from the model's name, as servers and hubs spell it: ``qwen2.5:1.5b``, ``Qwen2.5-1.5B-Instruct``,
  ``llama3.2:3b``, ``mixtral-8x7b`` (56);
- else from what the server says of it: llama.cpp's ``GET /v1/models`` gives each model's
  ``meta.n_params``, Ollama's ``POST /api/show`` its ``details.parameter_size`` ("1.5B").

A model whose size cannot be told (``gpt-4o-mini``, a server that says nothing) gets the
one-call Manager: the larger models do well with it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx2

from app.config import Settings

logger = logging.getLogger("memproxy.manager")

_SIZE = re.compile(r"(?<![\w.])(?:(\d+)x)?(\d+(?:\.\d+)?)\s*b(?![a-z])", re.IGNORECASE)
_IN_NAME = re.compile(r"(?<![\d.x])(?:(\d+)x)?(\d+(?:\.\d+)?)b(?![a-z])", re.IGNORECASE)
ASK_SECONDS = 5.0


def billions_in_name(name: str) -> float | None:
    """The size a model's name gives, in billions of parameters ("qwen2.5:1.5b" -> 1.5)."""
    sizes = [
        float(size) * (int(experts) if experts else 1) for experts, size in _IN_NAME.findall(name)
    ]
    return max(sizes) if sizes else None  # "Qwen3-30B-A3B": 30 in all, 3 active


def _billions(text: str) -> float | None:
    match = _SIZE.search(text)
    if match is None:
        return None
    return float(match.group(2)) * (int(match.group(1)) if match.group(1) else 1)


async def billions_served(
    http: httpx2.AsyncClient, base_url: str, model: str, *, ollama: bool, key: str | None
) -> float | None:
    """The size the server gives for `model`, or None when its answer gives none (a 4xx,
    another shape). Raises when it could not be asked (no answer, a 5xx, one too large)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if ollama:
        root = base_url.rstrip("/").removesuffix("/v1")
        answer = await http.post(f"{root}/api/show", json={"model": model}, headers=headers,
                                 timeout=ASK_SECONDS)  # fmt: skip
    else:
        answer = await http.get(f"{base_url.rstrip('/')}/models", headers=headers,
                                timeout=ASK_SECONDS)  # fmt: skip
    if answer.status_code >= 500:  # llama.cpp answers 503 while its model loads: ask again
        answer.raise_for_status()
    try:
        body: Any = answer.json() if answer.is_success else {}
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if ollama:
        details = body.get("details")
        return _billions(str(details.get("parameter_size", ""))) if isinstance(details, dict) \
            else None  # fmt: skip
    for entry in body.get("data") or []:
        if isinstance(entry, dict) and entry.get("id") == model:
            meta = entry.get("meta")
            params = meta.get("n_params") if isinstance(meta, dict) else None
            return float(params) / 1e9 if isinstance(params, int | float) else None
    return None


class Steps:
    """Whether a model gets the two-step Manager, by ``MEMPROXY_MANAGER_STEPS`` and, for
    ``auto``, its size (asked of the server once per server and model, until it answers)."""

    def __init__(self, settings: Settings, http: httpx2.AsyncClient, base_url: str) -> None:
        self._settings = settings
        self._http = http
        self._base_url = base_url
        self._sizes: dict[str, float | None] = {}

    async def two(self, model: str, *, ask_server: bool = True) -> bool:
        """Whether `model` gets the two-step Manager; `ask_server` false: by its name only."""
        s = self._settings
        if s.manager_steps != "auto":
            return s.manager_steps == "two"
        if model not in self._sizes:
            size = billions_in_name(model)
            if size is None and ask_server:
                secret = s.manager_api_key or s.upstream_api_key
                try:
                    size = await billions_served(
                        self._http, self._base_url, model, ollama=s.manager_provider == "ollama",
                        key=secret.get_secret_value() if secret is not None else None,
                    )  # fmt: skip
                except Exception as exc:  # asked again next time; the one-call one meanwhile
                    logger.info("could not read the size of model %s: %s", model, exc)
                    return False
            self._sizes[model] = size
            small = size is not None and size <= s.manager_small_model_billions
            logger.info("model %s (%s): the %s manager", model,
                        f"{size:g}B" if size is not None else "size unknown",
                        "two-step" if small else "one-call")  # fmt: skip
        size = self._sizes[model]
        return size is not None and size <= s.manager_small_model_billions
