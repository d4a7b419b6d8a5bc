"""The ``ddlsim`` parser, and how every command ends: its exit status, or one error line.

Every user error (a bad scenario, a missing file, an unknown backend, a corrupt trace)
ends with one line ``ddlsim: error: …`` on stderr and exit status 2; results already
written stay on disk.
"""

from __future__ import annotations

import argparse
import signal
import sys
import warnings
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ...backends.base import BackendError
from ...simulator.compute import ProfileError
from ...simulator.trace import TraceError
from ..executors import check_executor
from ..messages import escape
from ..schema import ScenarioError
from .advise import register as add_advise
from .calibrate import register as add_calibrate
from .common import UsageError
from .figures import register as add_figures
from .info import register as add_info
from .replay import register as add_replay
from .sweep import register as add_sweep
from .validate import register as add_validate

# each command group's part of the parser, in the order ``ddlsim --help`` lists them
COMMANDS = (add_sweep, add_info, add_figures, add_calibrate, add_validate, add_replay, add_advise)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddlsim", description="Predict the accuracy/runtime tradeoff of "
                                 "distributed deep-learning training.")
    ap.add_argument("--version", action="version", version=f"ddlsim {_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return ap


def _version() -> str:
    try:
        return version("ddlsim")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _warning_line
    jobs = getattr(args, "jobs", None)
    if jobs is not None and not 1 <= jobs <= 4096:
        print(f"ddlsim: error: --jobs = {jobs}: must be between 1 and 4096", file=sys.stderr)
        return 2
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        check_arguments(args)
        return int(args.func(args) or 0)
    except (ScenarioError, TraceError, BackendError, ProfileError, UsageError, ValueError) as e:
        _error(str(e))
        return 2
    except UnicodeDecodeError as e:
        _error(f"a file is not UTF-8 text ({e.reason} at byte {e.start})")
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        return 2
    except RecursionError:
        _error("an input is nested too deeply")
        return 2
    except KeyboardInterrupt:
        print("\nddlsim: interrupted; completed runs are kept (rerun with --resume)", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  line: str | None = None) -> str:
    """A warning as the command line shows it: one line, no source location."""
    return f"ddlsim: warning: {escape(str(message))}\n"


def _error(message: str) -> None:
    """One line on stderr; control characters of names and keys in it are shown escaped
    (a newline or a terminal escape in a file name must not break or colour the line)."""
    print(f"ddlsim: error: {escape(message)}", file=sys.stderr)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse option combinations that would be silently ignored."""
    if getattr(args, "keep_failed", False) and not getattr(args, "resume", False):
        raise UsageError("--keep-failed without --resume: it keeps the earlier failures of a resumed sweep; add "
                         "--resume")
    if getattr(args, "scheduler", None) is not None:
        check_executor(getattr(args, "executor", "local"), args.scheduler)  # and a scheduler answers there


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends a command like Ctrl-C: completed runs kept, workers stopped."""
    raise KeyboardInterrupt

