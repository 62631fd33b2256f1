"""seqio Task definitions: sources, vocabularies and preprocessors of real data sets.

Like `experiments`, this package is the one beside `lingvo_lite/` even when the working
directory has a `tasks/` package of its own (lingvo_lite/config/builtin_packages.py).
"""
