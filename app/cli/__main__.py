"""``python -m app.cli ...``: the same as the ``branchwise`` console script."""

import sys

from app.cli.commands import main

sys.exit(main())
