"""Benchmarks: lingvo_lite against plain references, timed side by side in one process."""
