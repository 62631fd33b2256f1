"""Decoding: settings, requests and their records, pure decode steps, their jitted and
sharded forms, sampling, and the generator that runs slots over a KV cache.
"""
