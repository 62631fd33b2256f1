"""Registered experiments, grouped by domain. Each module's classes register under their path
below this package: experiments/lm/pycode.py:PyCodeTiny -> lm.pycode.PyCodeTiny.

lingvo_lite.config.registry imports every module here (a broken one is reported and skipped). This
package is the one beside `lingvo_lite/` even when the working directory has an `experiments/`
package of its own, which then joins this one's path (lingvo_lite/config/builtin_packages.py).
"""
