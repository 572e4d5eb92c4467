"""``python -m app.cli``: the same as the ``memproxy`` command."""

import sys

from app.cli.commands import main

sys.exit(main())
