"""The ``icesink`` command line: --version, --log-level and --log-format anywhere and from the
environment, JSON log lines, and failures a user causes at start as one line naming what and
where (the broker-down and catalog-down cases run the real command:
tests/integration/test_start_failures.py)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from icesink.app import cli


@pytest.fixture(autouse=True)
def _fresh_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers, root.level = handlers, level


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch | None = None) -> int:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return int(exc.value.code or 0)


def test_version_prints_the_package_version(capsys):
    assert _run(["--version"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"icesink \d+\.\d+\.\d+\S*\n", out), out


@pytest.mark.parametrize("argv", [["--log-level", "debug", "worker"], ["worker", "--log-level", "DEBUG"]])
def test_log_level_goes_before_or_after_the_command(argv, monkeypatch):
    monkeypatch.delenv("ICESINK_LOG_LEVEL", raising=False)
    args = cli.build_parser().parse_args(argv)
    assert args.log_level == "DEBUG"


def test_log_level_and_format_come_from_the_environment_and_a_flag_wins(monkeypatch):
    monkeypatch.setenv("ICESINK_LOG_LEVEL", "warning")
    monkeypatch.setenv("ICESINK_LOG_FORMAT", "json")
    args = cli.build_parser().parse_args(["worker"])
    assert (args.log_level, args.log_format) == ("WARNING", "json")
    args = cli.build_parser().parse_args(["worker", "--log-level", "ERROR", "--log-format", "text"])
    assert (args.log_level, args.log_format) == ("ERROR", "text")


def test_an_unknown_log_level_is_refused_naming_it(capsys, monkeypatch):
    monkeypatch.delenv("ICESINK_LOG_LEVEL", raising=False)
    assert _run(["--log-level", "LOUD", "worker"]) == 2
    assert "LOUD" in capsys.readouterr().err
    monkeypatch.setenv("ICESINK_LOG_LEVEL", "chatty")
    assert _run(["worker"]) == 2
    assert "ICESINK_LOG_LEVEL" in capsys.readouterr().err


def test_json_log_lines_are_one_object_each_and_stay_redacted(capsys):
    from icesink.shared.secrets import install_log_redaction

    cli._setup_logging("INFO", "json")
    install_log_redaction(lambda text: text.replace("hunter2", "[hidden]"))
    log = logging.getLogger("icesink.test")
    log.warning("password %s for %s", "hunter2", "db")
    try:
        raise ValueError("bad hunter2\nsecond line")
    except ValueError:
        log.exception("failed")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "icesink.test"
    assert first["message"] == "password [hidden] for db" and "time" in first
    assert second["message"] == "failed" and "ValueError: bad [hidden]" in second["exception"]
    assert "hunter2" not in "".join(lines)


def test_a_missing_or_unreadable_config_file_is_one_line(tmp_path, capsys):
    assert _run(["worker", "--config", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config" in err[0] and "nope.json" in err[0] and "No such file" in err[0], err
    logging.disable(logging.NOTSET)  # as in a new process
    (tmp_path / "dir.json").mkdir()
    assert _run(["worker", "--config", str(tmp_path / "dir.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dir.json" in err[0], err


@pytest.mark.parametrize("error", ["start", "config"])
def test_the_one_line_of_a_failed_start_is_the_last_line_logged(monkeypatch, capsys, error):
    """A start failure is one line, the last: a thread still starting beside it (the Spark
    session's) logged after it in CI ('spark: the JVM is given the class-data archive')."""
    import threading

    from icesink.shared.errors import ConfigError, StartFailure

    def fail(args):
        raise StartFailure("the catalog is down") if error == "start" else ConfigError("x", 1, "2")

    monkeypatch.setattr(cli, "cmd_worker", fail)
    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_fn(parser(), fail))
    with pytest.raises(SystemExit):
        cli.main(["worker"])
    late = threading.Thread(target=lambda: logging.getLogger("spark_bridge.class_archive").info("late line"))
    late.start()
    late.join()
    err = capsys.readouterr().err.strip().splitlines()
    assert " ERROR " in err[-1] and "late line" not in "\n".join(err)


def test_a_line_another_thread_had_under_way_is_not_written_after_the_failed_starts_line(monkeypatch, capsys):
    """CI again: the Spark start thread's line came 3 ms after the ERROR line, a record made
    before logging was silenced and written after. Such a record now goes nowhere."""
    import threading

    from icesink.shared.errors import StartFailure

    def fail(args):
        raise StartFailure("the catalog is down")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_fn(parser(), fail))
    spark = logging.getLogger("spark_bridge.class_archive")
    made, go = threading.Event(), threading.Event()

    def starting():
        record = spark.makeRecord(spark.name, logging.INFO, __file__, 0, "under way", (), None)
        made.set()
        go.wait(10)
        spark.handle(record)  # past its level check before the failure, written after it

    late = threading.Thread(target=starting)
    original = cli._setup_logging

    def setup_then_start(*a):
        original(*a)
        late.start()
        made.wait(10)

    monkeypatch.setattr(cli, "_setup_logging", setup_then_start)
    with pytest.raises(SystemExit):
        cli.main(["worker"])
    go.set()
    late.join()
    err = capsys.readouterr().err.strip().splitlines()
    assert " ERROR " in err[-1] and "under way" not in "\n".join(err), err


def _with_fn(parser, fn):
    parser.set_defaults(fn=fn)
    for action in parser._subparsers._group_actions:  # each subcommand's own default
        for sub in action.choices.values():
            sub.set_defaults(fn=fn)
    return parser
