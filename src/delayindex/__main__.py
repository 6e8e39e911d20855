"""``python -m delayindex`` runs the command line."""

import sys

from delayindex.cli import main

sys.exit(main())
