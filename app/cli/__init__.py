"""The ``memproxy`` command (``memproxy = "app.cli:main"``; ``python -m app.cli`` runs it too).

- commands.py: the parser, ``serve``, ``db``, ``model``, ``ready``, ``fake-upstream``, and the
  one place a bad setting or database becomes a line on stderr and exit status 2;
- memory_args.py: the arguments of ``memories``, ``users``, ``jobs`` and ``index``;
  memory.py runs them, through memory_read.py, memory_write.py and admin.py;
- show.py: what those commands print, and where (stdout the result, stderr the rest).
"""

from app.cli.commands import main

__all__ = ["main"]
