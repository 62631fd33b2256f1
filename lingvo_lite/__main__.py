"""`python -m lingvo_lite ...` runs the executor."""

from lingvo_lite.executor import run_main

if __name__ == "__main__":
  run_main()
