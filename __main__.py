"""``python -m ddlsim``: the ``ddlsim`` command."""

import sys

from .scenarios.cli import main

sys.exit(main())
