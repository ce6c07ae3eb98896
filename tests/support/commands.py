"""`convgen` commands run in this process (`convgen.cli.main`), with what they printed."""

from __future__ import annotations

import contextlib
import io

from convgen import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `convgen ARGV`, read through pytest's capsys."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_cli(*argv: str) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `convgen ARGV`, its sys.stdout and sys.stderr redirected
    (for callers without capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()
