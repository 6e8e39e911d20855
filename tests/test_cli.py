"""The ``delayindex`` command line: ``simulate`` verifies itself and exit codes follow the docs."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from delayindex import FileStorage
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, main
from delayindex.simulate import SimulationResult, run_simulation


def test_demo_json_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--messages", "30000", "--json"]) == EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is True
    assert result["messages"] == 30_000
    assert result["lost"] == result["polled_twice"] == result["early"] == 0
    # Every tracked message came back through poll unless a replay found it due first.
    assert 0 < result["polled"] <= result["tracked"]
    assert result["immediate"] + result["tracked"] == 30_000


def test_demo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["simulate", "--messages", "5000", "--strict", "--tick-ms", "0", "--no-progress"]) == 0
    )
    out = capsys.readouterr().out
    assert "verified" in out and "lost" in out


def test_demo_result_flags_problems() -> None:
    result = run_simulation(2000, seed=3)
    assert result.ok
    broken = SimulationResult(**{**result.__dict__, "lost": 1})
    assert not broken.ok


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--messages", "0"],
        ["simulate", "--tick-ms", "-1"],
        ["demo", "--messages", "0"],
        [],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE


def test_python_dash_m_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delayindex", "simulate", "--messages", "2000", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    assert EXIT_CHECK_FAILED == 1


@pytest.mark.parametrize("command", ["rebuild", "verify"])
def test_a_bad_dump_fails_before_spark_starts(
    command: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A dump path without a known format (or missing) is a usage error at once: no JVM."""
    import delayindex.cli.rebuild as cli_rebuild

    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started for a bad dump")

    monkeypatch.setattr(cli_rebuild, "_spark_session", no_spark)
    FileStorage(tmp_path / "store").close()  # an empty store (verify needs one)
    (tmp_path / "dump10m").write_bytes(b"PAR1")
    base = [command, "--store", str(tmp_path / "store"), "--name", "t"]
    assert main([*base, str(tmp_path / "dump10m")]) == EXIT_USAGE
    assert "cannot tell the dump format" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "missing.parquet")]) == EXIT_USAGE
