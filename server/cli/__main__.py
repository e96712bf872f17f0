"""``python -m bertserve.server.cli``: the ``bertserve`` command."""

from .main import main

raise SystemExit(main())
