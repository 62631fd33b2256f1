"""Registered experiments, grouped by domain. Each module's classes register under their path
below this package: experiments/lm/pycode.py:PyCodeTiny -> lm.pycode.PyCodeTiny."""
