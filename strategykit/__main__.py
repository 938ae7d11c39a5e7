"""`python -m strategykit ARGS`: the `strategykit` command, as `strategykit ARGS`.

A fresh `python -m strategykit` never gets here: the package's `__init__` makes the
process the command first (`strategykit.cli.run_as_module`). A tool that runs the module
in its own process (`runpy.run_module`) does, and runs the command's entry point here.
"""

import sys

from strategykit_console import main

sys.exit(main())
