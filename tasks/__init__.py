"""seqio Task definitions: sources, vocabularies and preprocessors of real data sets."""
