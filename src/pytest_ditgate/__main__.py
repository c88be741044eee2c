"""``python -m pytest_ditgate`` is the ``ditgate`` command."""

import sys

from pytest_ditgate.cli import main

sys.exit(main())
