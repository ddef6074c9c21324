"""`python -m toolchain`: the `arenac` command line, for a checkout without the entry point."""

import sys

from toolchain.cli import main

sys.exit(main())
