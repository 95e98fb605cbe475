"""When the reader of our stdout goes away (``k8s-bridge tail | head -1``).

Unix tools end quietly then (SIGPIPE ends them; the shell reports 141).
Python turns the same event into ``BrokenPipeError`` on the write that
failed, and again when it flushes stdout at exit; pointing stdout at
/dev/null makes every later write, and that final flush, harmless.
"""

from __future__ import annotations

import os
import sys

# 128 + SIGPIPE: the status a shell reports for a tool that SIGPIPE ended.
EXIT_BROKEN_PIPE = 141


def discard_stdout() -> None:
    """Send whatever is still written to stdout, buffered or not, to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
