"""`python -m convgen`: the same command line as the `convgen` console script (convgen.cli)."""

import sys

from .cli import main

sys.exit(main())
