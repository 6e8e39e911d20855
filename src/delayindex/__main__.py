"""``python -m delayindex`` runs the command line."""

from delayindex.cli import entry

entry()
