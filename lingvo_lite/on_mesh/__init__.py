"""A Setup's training on a mesh: its jitted train and eval steps with their shardings, the
state made, restored and placed (jitted.py), and one pass over each eval set (evaluation.py).
The running floor above training/'s parts and checkpoints/ and weights/ (decode/ is its
mirror for decoding).
"""
