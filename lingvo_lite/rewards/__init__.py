"""Rewards for reinforcement learning from verifiable rewards: registered functions of a
prompt's record and a completion (registry.py), and the built-ins, one module each, imported
here so that their names are registered wherever the registry is used."""

from lingvo_lite.rewards import answer_format, code_tests, exact_answer  # noqa: F401
