"""lingvo_lite: declarative language-model experiments on JAX, configured with Fiddle."""

import os

# TensorFlow is only the data pipeline's engine here: keep its C++ start-up chatter quiet.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
