"""Training: optimizers, the train state and its shapes, the pure train and eval steps, their
jitted and sharded forms, and one pass over the eval sets (decode/ is its mirror for decoding).
"""
