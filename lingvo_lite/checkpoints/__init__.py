"""Checkpoints: saving and restoring with orbax, their checksums, their health, and their
errors in one line each.
"""
