"""Spark's Python daemon for local delayindex sessions: ``pyspark.daemon``, imports done once.

On Linux, Spark starts one Python *daemon* per worker environment and forks a worker from it
for each Python task slot. Each forked worker imports what its task needs. Two things made that
cost 2-4 CPU seconds per worker on a cold start:

* Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the workers'
  ``PYTHONPATH``. Python never caches bytecode for modules imported from a zip, so every worker
  compiled pyspark's modules again (about 1.3 s of CPU, measured);
* with ``PYTHONDONTWRITEBYTECODE=1`` (or a read-only install) every worker compiled delayindex
  and imported numpy and pyarrow on its own.

``local_session`` sets ``spark.python.daemon.module`` to this module for local masters (the
driver's interpreter is then the workers'). It does what ``pyspark.daemon`` does, after two
steps:

1. when ``$SPARK_HOME`` is the pip-installed pyspark package itself (so the zips hold the very
   same code), the zips move to the end of ``sys.path``: pyspark and py4j then load from the
   installed packages, whose bytecode is compiled once at install time. Any other layout (a
   Spark distribution whose zips may differ from an installed pyspark) is left alone;
2. the modules a rebuild's or a verify's tasks use are imported in the daemon, so every
   forked worker starts with them already loaded.

Nothing here changes what runs in a task; a failure in step 2 is left for the task itself to
raise, where ``check_workers`` reports it with its fix.
"""

from __future__ import annotations

import importlib
import os
import sys

#: Imported by the daemon so that forked workers inherit them (what the scan and build tasks
#: and the workers' check import).
PRELOADED_MODULES = (
    "numpy",
    "pyarrow",
    "delayindex",
    "delayindex.spark.scan",
    "delayindex.spark.build",
    "delayindex.spark.job",
)


def installed_pyspark_zips(path: list[str], spark_home: str | None) -> list[str]:
    """The entries of ``path`` that are zips under ``$SPARK_HOME/python/lib`` when
    ``spark_home`` is the installed pyspark package (its ``__init__.py`` there, its parent
    directory on ``path``); an empty list for any other layout."""
    if not spark_home:
        return []
    home = os.path.realpath(spark_home)
    package_parent = os.path.dirname(home)
    if os.path.basename(home) != "pyspark" or not os.path.isfile(os.path.join(home, "__init__.py")):
        return []
    if package_parent not in {os.path.realpath(p) for p in path if p}:
        return []
    lib = os.path.join(home, "python", "lib")
    return [p for p in path if p.endswith(".zip") and os.path.dirname(os.path.realpath(p)) == lib]


def prefer_installed_pyspark() -> list[str]:
    """Move the installed pyspark's own zips to the end of ``sys.path`` (see the module
    docs); return the entries moved."""
    moved = installed_pyspark_zips(sys.path, os.environ.get("SPARK_HOME"))
    for entry in moved:
        sys.path.remove(entry)
        sys.path.append(entry)
    return moved


def preload(modules: tuple[str, ...] = PRELOADED_MODULES) -> list[str]:
    """Import ``modules``; return the names that failed (their tasks will say why)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # a worker's own import raises it again, with check_workers' fix
            failed.append(name)
    return failed


def main() -> None:
    """Run Spark's daemon after :func:`prefer_installed_pyspark` and :func:`preload`."""
    prefer_installed_pyspark()
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
