"""A local SparkSession set up the way the rebuild job (and the tests) need it.

How it works. :func:`find_java_home` looks for a Java 17 to 25 installation: ``$JAVA_HOME``, then
the ``java`` on ``PATH`` (symlinks resolved, ``<home>/bin/java``), then the usual distribution
directories (``/usr/lib/jvm/*``, ...), asking each ``java -version`` for its major version.
:func:`local_session` exports that ``JAVA_HOME`` and ``PYSPARK_PYTHON=sys.executable`` (pyspark's
default is the ``python3`` on ``PATH``, which outside an activated venv lacks delayindex: the
Python workers then fail with ``ModuleNotFoundError``), then builds the session with the measured
settings: C1-only JIT and the serial GC (session start 5 s instead of 9-13 s; with
``quick_start=False`` the full JIT, 2-3x faster for the JVM's share of a large job), no UI and no
console progress bars, Arrow on with 100 000-row batches, a local master's driver bound to
127.0.0.1, a private temporary ``spark.local.dir`` and warehouse (removed at exit), and log level
ERROR from the JVM's first line on (a log4j2 configuration file, not ``setLogLevel`` alone). A
local master's Python workers fork from :mod:`delayindex.spark._daemon` (Spark's
``spark.python.daemon.module``), which loads pyspark from the installed package rather than
Spark's zip (bytecode compiled once, at install) and imports the job's modules once for every
worker: a 10 M-row rebuild's job 1.3-1.8 s shorter.

Class archive (``class_archive``, which the command line uses: :func:`default_class_archive`):
starting Spark's JVM loads and verifies about 10 000 classes from its jars, most of the start's
CPU time. With Java's class data sharing (AppCDS) they are mapped, already parsed and verified,
from an archive file instead: the JVM then starts with about half the CPU. The archive is
written once, by a session's JVM when it exits (``-XX:ArchiveClassesAtExit``, to a temporary
file: the session's owner waits for the JVM's exit, :func:`stop_jvm`, checks the file with a
``java -version`` that maps it, and renames it into place), and used by the later sessions
(``-XX:SharedArchiveFile``). A truncated archive would crash the JVM, hence the temporary file
and the check; an archive of another Java or Spark installation is refused by the JVM and
ignored (its file name carries a hash of both; the JVM's CDS log lines are off).

:func:`check_workers` runs once per Spark application, before a job's first stage: a job with one
task per core whose Python workers import delayindex. A session made elsewhere (``getOrCreate``
in user code, spark-submit) may start workers with a Python lacking delayindex; without the check
they fail deep inside the first real stage with a bare ``ModuleNotFoundError``. The check is an
RDD job, as the rebuild's scan and build are (:mod:`delayindex.spark.tasks`): it starts every
core's worker at once, and the rebuild's stages reuse them (a new worker costs about a second
of CPU even when it forks from the daemon above; pyspark's own daemon made it 2-4 s).

Invariants: nothing here imports pyspark at module import time (``import delayindex.spark`` works
without the ``spark`` extra; using it raises :class:`SparkUnavailableError` naming the extra).
JVM options and the driver memory only take effect when this call starts the JVM: the first
session of a process decides them (``getOrCreate`` returns an existing session as it is).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayindex.errors import DelayIndexError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Java major versions Spark 4 runs on (17 and 21 are supported; up to 25 was seen to work).
MIN_JAVA = 17
MAX_JAVA = 25
#: JVM flags of a quick start (the measured recipe): C1 only and the serial GC halve start-up.
QUICK_START_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: JVM flags for throughput: the full JIT, and the serial GC (no concurrent GC threads
#: competing for the cores; the heap is small).
THROUGHPUT_OPTIONS = "-XX:+UseSerialGC"
#: Rows per Arrow batch handed to Python: 10x Spark's default, fewer round trips per row.
ARROW_BATCH_ROWS = 100_000
#: ``spark.python.daemon.module`` of local sessions (``delayindex.spark._daemon``: pyspark's
#: daemon with compiled imports, done once for every worker it forks).
LOCAL_DAEMON_MODULE = "delayindex.spark._daemon"
#: Environment variable naming the command line's class archive file; empty or ``off``: none.
CLASS_ARCHIVE_ENV = "DELAYINDEX_SPARK_CLASS_ARCHIVE"
#: JVM flag that silences the class data sharing log (by default on stdout: a ``--json``
#: report would get the JVM's notes about jars it does not archive).
_CDS_QUIET = "-Xlog:cds*=off"
#: A temporary archive older than this is a leftover of a killed run.
_STALE_ARCHIVE_SECONDS = 3600
#: The JVM's log4j2 configuration: the level from the start (not after the first lines), on
#: stderr, without the "default log4j profile" banner. pyspark's gateway counts as a shell, whose
#: logger Spark raises to WARN with a notice unless it is configured: so it is, at the same level.
_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
_JVM_DIRS = ("/usr/lib/jvm", "/usr/java", "/opt/java", "/Library/Java/JavaVirtualMachines")


class SparkUnavailableError(DelayIndexError, RuntimeError):
    """pyspark (the ``spark`` extra) or a suitable Java is missing; the message says which."""


#: Spark application ids whose Python workers were seen to import delayindex.
_WORKERS_OK: set[str] = set()
_WORKERS_LOCK = threading.Lock()
#: The archive this process's JVM writes when it exits: (temporary file, final file), or None.
_ARCHIVE_PENDING: list[tuple[Path, Path]] = []
_WORKER_FIX = (
    "set PYSPARK_PYTHON (or the spark.pyspark.python setting) to a Python interpreter that has "
    "delayindex installed, e.g. this process's own ({python}), before the session starts, or "
    "install delayindex (with its dependencies) on every worker; "
    "delayindex.spark.local_session does the former for a local session"
)


def java_major_version(java: str | os.PathLike[str]) -> int | None:
    """The major version of the ``java`` executable at ``java`` (8 for ``1.8``), or None when it
    does not run or its version cannot be read."""
    try:
        done = subprocess.run(
            [os.fspath(java), "-version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392" is Java 8
        major = int(match.group(2))
    return major


def _candidates() -> list[Path]:
    homes: list[Path] = []
    env = os.environ.get("JAVA_HOME")
    if env:
        homes.append(Path(env))
    on_path = shutil.which("java")
    if on_path:
        homes.append(Path(os.path.realpath(on_path)).parent.parent)
    for root in _JVM_DIRS:
        base = Path(root)
        if base.is_dir():
            mac = root.startswith("/Library")
            homes.extend(c / "Contents" / "Home" if mac else c for c in sorted(base.iterdir()))
    return list(dict.fromkeys(homes))


@functools.cache
def find_java_home() -> str | None:
    """A ``JAVA_HOME`` whose ``bin/java`` is Java 17 to 25, or None if there is none.

    Tried in order: ``$JAVA_HOME``, the ``java`` on ``PATH`` (symlinks resolved), then the
    distribution directories (``/usr/lib/jvm/*`` and the like). The answer is cached.
    """
    for home in _candidates():
        java = home / "bin" / "java"
        if not java.is_file():
            continue
        version = java_major_version(java)
        if version is not None and MIN_JAVA <= version <= MAX_JAVA:
            return str(home)
    return None


def require_spark() -> None:
    """Raise :class:`SparkUnavailableError` unless pyspark, pyarrow and pandas are installed.

    Looks them up without importing them: pandas alone takes half a second to import, and a
    job that never converts to pandas need not pay for it.
    """
    missing = []
    for module in ("pyspark", "pyarrow", "pandas"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-imported package
            found = False
        if not found:
            missing.append(module)
    if missing:
        raise SparkUnavailableError(
            f"{', '.join(missing)} not installed: install the spark extra "
            "(pip install 'delayindex[spark]')"
        )


def check_workers(spark: Any) -> str | None:
    """Check once per Spark application that its Python workers can import delayindex.

    Runs a job with one task per core (``defaultParallelism``) whose tasks import delayindex
    and pyarrow and report delayindex's version and path (returned, from the first task, e.g.
    ``"0.1.0 /site-packages/delayindex/__init__.py"``); later calls for the same application
    return None at once. Sessions without a SparkContext (Spark Connect) are not checked
    (None). The job is an RDD job over a range, the kind the rebuild's scan (on a dump in topic
    order) and build run (:mod:`delayindex.spark.tasks`), so every core's Python worker starts
    now, at once, and those stages reuse them (pyspark keeps one pool of workers per kind of
    job).

    Raises:
        SparkUnavailableError: the workers cannot import delayindex or pyarrow, or cannot run a
            Python task at all; the message says how to fix it.
    """
    try:
        sc = spark.sparkContext
        app = str(sc.applicationId)
    except Exception:  # Spark Connect has no SparkContext: nothing to check
        return None
    with _WORKERS_LOCK:
        if app in _WORKERS_OK:
            return None

    def probe(_rows: Iterable[Any]) -> Iterator[str]:
        # Pickled by value (a local function): the worker needs no delayindex to load it.
        import importlib as worker_importlib
        import sys as worker_sys

        try:
            import delayindex

            worker_importlib.import_module("pyarrow")
        except ImportError as exc:
            yield f"!{worker_sys.executable}: {type(exc).__name__}: {exc}"
            return
        yield f"{delayindex.__version__} {delayindex.__file__}"

    fix = _WORKER_FIX.format(python=sys.executable)
    tasks = max(1, int(sc.defaultParallelism))
    try:
        answers = [
            str(a) for a in sc.parallelize(range(tasks), tasks).mapPartitions(probe).collect()
        ]
    except Exception as exc:
        missing = "ModuleNotFoundError" in str(exc) or "No module named" in str(exc)
        what = "cannot import a module they need" if missing else "cannot run a Python task"
        raise SparkUnavailableError(f"Spark's Python workers {what}: {fix}") from exc
    failed = [a for a in answers if a.startswith("!")]
    if failed or not answers:
        worker = failed[0][1:] if failed else "no answer from the workers"
        raise SparkUnavailableError(
            f"Spark's Python workers cannot import delayindex or pyarrow (worker {worker}): {fix}"
        )
    with _WORKERS_LOCK:
        _WORKERS_OK.add(app)
    return answers[0]


def local_session(
    master: str = "local[*]",
    *,
    driver_memory: str = "1g",
    shuffle_partitions: int = 8,
    app_name: str = "delayindex",
    log_level: str = "ERROR",
    quick_start: bool = True,
    class_archive: str | os.PathLike[str] | None = None,
    lazy: bool = False,
) -> Any:
    """Start (or return the running) SparkSession with the settings in the module docs.

    Args:
        master: ``local[*]``, ``local[2]``, or a cluster URL (the session then needs the
            cluster's own set-up: the same Python with delayindex on every worker).
        driver_memory: ``spark.driver.memory`` (1g is enough for a 10 M-message rebuild).
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (2 suits tests, 8 a 10 M job).
        app_name: the application name.
        log_level: set on the SparkContext right after start.
        quick_start: C1-only JIT (:data:`QUICK_START_OPTIONS`): the JVM is up in about half
            the time, which suits tests and small dumps. Large rebuilds should pass False: the
            JVM's shuffle and Arrow conversion then run 2-3x faster once warm.
        class_archive: a class data sharing archive file (module docs): used if it exists,
            else written by this session's JVM when it exits (:func:`stop_jvm`, or the
            process's exit). None: no archive. Only a session that starts the JVM uses it.
        lazy: start only the SparkContext and return a :class:`LazySparkSession`, whose
            Spark SQL half starts when something first needs it (about 1.4 s of the JVM's
            time that RDD-only work, such as rebuilding a dump in topic order, never spends).

    Raises:
        SparkUnavailableError: pyspark/pyarrow/pandas missing, or no Java 17-25 found.
        ValueError: ``shuffle_partitions < 1``.
    """
    if shuffle_partitions < 1:
        raise ValueError(f"shuffle_partitions must be >= 1, got {shuffle_partitions}")
    require_spark()
    java_home = find_java_home()
    if java_home is None:
        raise SparkUnavailableError(
            f"no Java {MIN_JAVA}-{MAX_JAVA} found (tried $JAVA_HOME, java on PATH, "
            f"{', '.join(_JVM_DIRS)}); on Debian/Ubuntu: apt-get install openjdk-17-jre-headless"
        )
    os.environ["JAVA_HOME"] = java_home
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    starts_jvm = getattr(SparkContext, "_gateway", None) is None
    scratch = tempfile.mkdtemp(prefix="delayindex-spark-")
    atexit.register(shutil.rmtree, scratch, True)
    log_config = Path(scratch) / "log4j2.properties"
    log_config.write_text(_LOG4J.format(level=log_level.lower()))
    jvm_options = (
        f"{QUICK_START_OPTIONS if quick_start else THROUGHPUT_OPTIONS} "
        f"-Dlog4j2.configurationFile={log_config.as_uri()}"
    )
    if class_archive is not None and starts_jvm:
        jvm_options += _archive_options(Path(class_archive))
    settings = {
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": jvm_options,
        "spark.executor.extraJavaOptions": jvm_options,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
        "spark.local.dir": os.path.join(scratch, "local"),
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
    }
    if master.startswith("local"):
        # Loopback only: the host name may not resolve (a WARN at start, DNS surprises in CI);
        # a cluster's executors must reach the driver, so leave binding alone there.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
        # The workers run this interpreter: a daemon that imports once for all of them.
        settings["spark.python.daemon.module"] = LOCAL_DAEMON_MODULE
    if lazy:
        from pyspark import SparkConf

        conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
        context = SparkContext.getOrCreate(conf)
        context.setLogLevel(log_level)
        return LazySparkSession(context)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session


class LazySparkSession:
    """A SparkSession whose Spark SQL half starts when something first needs it.

    ``sparkContext`` is there at once (RDD jobs need nothing else); any other attribute
    (``read``, ``range``, ``conf``, ...) first makes the SparkSession of that context, which
    takes about 1.4 s of the JVM's time on a fresh JVM, and is then that session's. The
    ``spark.sql.*`` settings given to the context apply to it. :meth:`stop` stops the session
    if it was made, else the context.
    """

    def __init__(self, context: Any) -> None:
        self.sparkContext = context
        self._session: Any = None
        self._lock = threading.Lock()

    @property
    def sql_started(self) -> bool:
        """Whether the SparkSession has been made."""
        return self._session is not None

    def session(self) -> SparkSession:
        """The SparkSession of this context (made on the first call)."""
        with self._lock:
            if self._session is None:
                from pyspark.sql import SparkSession

                self._session = SparkSession(self.sparkContext)
            return self._session  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Stop the session if it was made, else the context."""
        if self._session is not None:
            self._session.stop()
        else:
            self.sparkContext.stop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_session", "_lock", "sparkContext"):
            raise AttributeError(name)
        return getattr(self.session(), name)


@contextlib.contextmanager
def session_for(master: str = "local[*]", **options: Any) -> Iterator[Any]:
    """The running SparkSession if there is one (left running; a running SparkContext
    without one comes as a :class:`LazySparkSession`), else a new :func:`local_session` on
    ``master`` with ``options`` (``lazy=True`` among them: a :class:`LazySparkSession`),
    stopped on exit: one place decides who owns a session, so a command never stops one that
    someone else started."""
    require_spark()  # a clear error naming the spark extra, before pyspark is imported
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    running: Any = SparkSession.getActiveSession()
    context = getattr(SparkContext, "_active_spark_context", None)
    if running is None and context is not None:
        running = LazySparkSession(context)  # someone else's context: used, not stopped
    session = running or local_session(master, **options)
    try:
        yield session
    finally:
        if running is None:
            stop_session(session)
            if _ARCHIVE_PENDING:
                stop_jvm()  # the archive is complete only once the JVM has exited


def stop_session(session: Any) -> None:
    """``session.stop()``, without waiting for pyspark's accumulator server to notice.

    That server's handler polls its connection once a second for updates and for the stop
    flag, and pyspark's stop waits for it: 0.8 s of a 10 M-row rebuild's 13 s, doing nothing.
    Here the server is stopped on a daemon thread instead (it has nothing left to receive once
    the JVM's context is stopped). Sessions of a pyspark without that attribute stop as usual.
    """
    context: Any = getattr(session, "sparkContext", None)
    server = getattr(context, "_accumulatorServer", None)
    if server is not None and callable(getattr(server, "shutdown", None)):
        context._accumulatorServer = None  # so that stop() skips it
    else:
        server = None
    try:
        session.stop()
    finally:
        if server is not None:
            threading.Thread(
                target=server.shutdown, name="delayindex-accumulator-stop", daemon=True
            ).start()


def default_class_archive() -> Path | None:
    """The class archive file the command line's sessions use (module docs), opt-in through
    ``$DELAYINDEX_SPARK_CLASS_ARCHIVE``: unset, empty or ``off``: None (no archive); ``on``:
    ``spark-classes-<hash>.jsa`` in ``$XDG_CACHE_HOME/delayindex`` (default
    ``~/.cache/delayindex``), the hash naming the Java and pyspark installations; anything
    else: that file. None also when pyspark or a suitable Java is missing. About 150 MB.

    Opt-in because the first run pays for writing it (about half a minute) and it is a large
    file left in the user's cache, which an operator should choose to have."""
    chosen = (os.environ.get(CLASS_ARCHIVE_ENV) or "").strip()
    if chosen.lower() in ("", "off"):
        return None
    if chosen.lower() != "on":
        return Path(chosen)
    java_home = find_java_home()
    try:
        import pyspark
    except ImportError:
        return None
    if java_home is None:
        return None
    spark_home = Path(pyspark.__file__).parent
    jars = sorted(p.name for p in (spark_home / "jars").glob("*.jar"))
    modules = Path(java_home) / "lib" / "modules"
    stamp = modules.stat().st_mtime_ns if modules.is_file() else 0
    key = "\n".join([os.path.realpath(java_home), str(stamp), str(spark_home),
                     str(pyspark.__version__), *jars])  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "delayindex"
    return cache / f"spark-classes-{digest}.jsa"


def _quoted(option: str) -> str | None:
    """``option`` as one word of Spark's JVM option string; None if it cannot be quoted."""
    if not any(c.isspace() for c in option):
        return option
    return None if '"' in option or "\\" in option else f'"{option}"'


def _archive_options(final: Path) -> str:
    """The JVM flags that use ``final`` if it exists, else write it (via a temporary file that
    :func:`stop_jvm` renames); empty when neither is possible."""
    if final.is_file():
        used = _quoted(f"-XX:SharedArchiveFile={final}")
        return f" {used} {_CDS_QUIET}" if used else ""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""  # no cache directory: start without an archive
    now = time.time()
    for old in final.parent.glob(f"{final.name}.*.tmp"):  # leftovers of killed runs
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > _STALE_ARCHIVE_SECONDS:
                old.unlink()
    temp = final.with_name(f"{final.name}.{uuid.uuid4().hex[:12]}.tmp")
    written = _quoted(f"-XX:ArchiveClassesAtExit={temp}")
    if written is None:
        return ""
    with _WORKERS_LOCK:
        if not _ARCHIVE_PENDING:
            atexit.register(stop_jvm)
        _ARCHIVE_PENDING.append((temp, final))
    return f" {written} {_CDS_QUIET}"


def _archive_ok(java_home: str, archive: Path) -> bool:
    """Whether a JVM maps ``archive`` without failing (a truncated one makes it abort)."""
    try:
        done = subprocess.run(
            [os.path.join(java_home, "bin", "java"), _CDS_QUIET,
             f"-XX:SharedArchiveFile={archive}", "-version"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def stop_jvm(timeout: float = 300.0) -> None:
    """Stop this process's Spark JVM (the gateway pyspark launched) and wait for its exit; then
    put the class archive it wrote in place (module docs). Stops a running SparkContext first.
    A later session in this process starts a new JVM. Nothing happens without a JVM."""
    from pyspark import SparkContext

    with _WORKERS_LOCK:
        pending = list(_ARCHIVE_PENDING)
        _ARCHIVE_PENDING.clear()
    gateway = getattr(SparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if gateway is not None:
        active = getattr(SparkContext, "_active_spark_context", None)
        if active is not None:
            active.stop()
        with contextlib.suppress(Exception):  # the JVM may be gone already
            gateway.shutdown()
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the gateway exits at the end of its stdin
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # its archive, if any, is not trusted below
                proc.wait()
        SparkContext._gateway = None
        SparkContext._jvm = None
    java_home = find_java_home()
    for temp, final in pending:
        ok = proc is not None and proc.returncode == 0 and temp.is_file()
        if ok and java_home is not None and _archive_ok(java_home, temp):
            with contextlib.suppress(OSError):
                os.replace(temp, final)
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
