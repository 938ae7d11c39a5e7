"""`python -m strategykit.cli ARGS`: the `strategykit` command, as `python -m strategykit`
(`strategykit/__main__.py` says how)."""

import sys

from strategykit_console import main

sys.exit(main())
