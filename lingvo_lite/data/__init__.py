"""Input pipelines: every source yields the batch of a given step as a function of (seed, step),
so a resumed run sees exactly the batches an uninterrupted run would have seen."""
