"""`python -m surgeon` runs the command line."""

import sys

from surgeon.cli import main

sys.exit(main())
