"""Entry point for `python bin/main.py ...` (same as `python -m lingvo_lite ...`)."""

import os
import signal
import sys

# As in lingvo_lite/__main__.py: SIGUSR1 waits for its handler instead of killing the process.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

# Running the file directly puts bin/ first on sys.path; the repository root is what's needed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lingvo_lite.executor import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == "__main__":
  run_main()
