"""`python -m strategykit.cli ...`: the `strategykit` command without its console script."""

import sys

from strategykit.cli.commands import main

sys.exit(main())
