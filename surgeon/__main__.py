"""`python -m surgeon` runs the command line."""

import sys

from surgeon.app.cli import main

sys.exit(main())
