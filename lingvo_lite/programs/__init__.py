"""Programs the executor runs on a built Setup: train, eval (and later decode, compile)."""
