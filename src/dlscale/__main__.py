"""`python -m dlscale` runs the command line."""

import sys

from dlscale.cli import main

sys.exit(main())
