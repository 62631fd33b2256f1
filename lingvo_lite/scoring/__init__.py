"""Scoring: each token's log-probability under a model, many sequences packed into few rows
(what lm-evaluation-harness asks of a model, and what a server's `echo` + `logprobs` returns)."""
