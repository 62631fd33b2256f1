"""Where a model's parameters come from besides its own job's checkpoints: weight sources.

A weight source is a config part (`fdl.Config(JobCheckpoint, job_log_dir=...)`), set as
`train.init_from`, that loads parameters only onto the model's mesh. Training starts from it
when its job has no checkpoint of its own (job_checkpoint.py says the order).
"""
