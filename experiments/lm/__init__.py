"""Language-model experiments."""
