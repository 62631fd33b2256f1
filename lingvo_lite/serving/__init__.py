"""Serving: a loaded model, the engine that runs its decode slots continuously, and the
OpenAI-style HTTP routes of `--mode=serve`."""
