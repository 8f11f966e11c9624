"""``python -m lakeshore`` is the ``lakeshore`` command."""

import sys

from lakeshore.cli import main

sys.exit(main())
