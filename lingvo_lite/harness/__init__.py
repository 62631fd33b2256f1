"""lm-evaluation-harness: its request kinds answered by a loaded model, and the `lingvo_lite`
lm_eval model over them."""
