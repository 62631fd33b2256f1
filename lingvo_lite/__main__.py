"""`python -m lingvo_lite ...` runs the executor (SIGUSR1 waits from the start: __init__.py)."""

from lingvo_lite.executor import run_main

if __name__ == "__main__":
  run_main()
