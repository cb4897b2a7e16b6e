"""The one base of edgebench's own exceptions.

Every exception class edgebench and its exporters define subclasses `EdgebenchError`
(keeping a second standard base, such as ValueError, where callers catch that). Such an
error means the input, the device or the environment is wrong, not edgebench: its message
names the thing and what to do, on one line, so the `edgebench` command (`edgebench.cli.main`)
shows that message alone and exits with code 2. Anything else that reaches the command is an
internal error (exit code 1, `--debug` shows the traceback). `tests/test_errors.py` checks that
no exception class of the package is left outside this base.

Torch-free and dependency-free: every module, device side included, may import it.
"""

from __future__ import annotations


class EdgebenchError(Exception):
    """An error edgebench explains itself: its message is the whole story for the user
    (what is wrong, and the fix), so the command line shows it alone and exits with code 2."""
