"""Training's parts: optimizers, the train state and its shapes, the objectives, and the pure
train and eval steps (on_mesh/ runs them: jitted with their shardings, and the eval passes).
"""
