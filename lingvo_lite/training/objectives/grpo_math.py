"""GRPO's arithmetic on log-probabilities: group advantages, the clipped surrogate with its
variants, the k3 KL to the reference, and the aggregations over tokens.

For a prompt's group of G completions with rewards r_1..r_G (DeepSeekMath, Shao et al. 2024):

  advantage     A_i = (r_i - mean(r)) / (std(r) + 1e-4)       ("group": GRPO; std with
                                                                Bessel's correction, as TRL)
                A_i = r_i - mean(r)                             ("mean": Dr. GRPO, Liu et al.
                                                                2025, no std division)
  ratio         rho_t = exp(log pi(y_t) - log pi_old(y_t))      (token level: GRPO)
                rho   = exp(mean_t (log pi(y_t) - log pi_old(y_t)))   (sequence level: GSPO,
                                                                Zheng et al. 2025, one per
                                                                completion)
  surrogate     l_t = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
                    (eps_low != eps_high: DAPO's "clip higher", Yu et al. 2025)
  KL (k3)       k_t = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1, added as beta * k_t

and the loss aggregates l_t + beta k_t over the completion tokens:

  "sequence"    each completion's token mean, then the mean over completions (GRPO)
  "token"       the sum over every token of the batch / the batch's tokens (DAPO)
  "constant"    the sum / (completions * max_new_tokens) (Dr. GRPO's constant length)

These are the formulas of TRL's `GRPOTrainer._compute_loss` (loss types grpo, dapo, dr_grpo;
importance_sampling_level token or sequence), which tests/training/test_grpo.py checks them
against. Every function is pure and takes [rows, tokens] arrays with a 0/1 mask of the
completion's tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# TRL's (and the DeepSeekMath code's) guard against a group whose rewards are all equal.
STD_EPSILON = 1e-4
ADVANTAGE_SCALES = ("group", "mean")
AGGREGATIONS = ("sequence", "token", "constant")
IMPORTANCE_LEVELS = ("token", "sequence")


def group_advantages(rewards: np.ndarray, group_size: int, scale: str) -> np.ndarray:
  """Each completion's advantage from the rewards [prompts * group_size] (each prompt's
  group contiguous): its reward less its group's mean, divided by the group's std plus
  STD_EPSILON where `scale` is "group"."""
  grouped = np.asarray(rewards, np.float64).reshape(-1, group_size)
  centred = grouped - grouped.mean(axis=1, keepdims=True)
  if scale == "group":
    centred = centred / (grouped.std(axis=1, ddof=1, keepdims=True) + STD_EPSILON)
  return centred.reshape(-1).astype(np.float32)


def zero_variance_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
  """Per completion, whether its group's rewards are all equal (its advantages all 0: the
  group teaches nothing)."""
  grouped = np.asarray(rewards, np.float64).reshape(-1, group_size)
  flat = np.all(grouped == grouped[:, :1], axis=1)
  return np.repeat(flat, group_size).astype(np.float32)


class Terms(NamedTuple):
  """Per token [rows, tokens] (a sequence-level ratio broadcast over its tokens)."""

  loss: jax.Array        # l_t + beta k_t
  ratio: jax.Array       # rho (the importance weight)
  clipped: jax.Array     # 1 where the clip is active: rho below 1 - eps_low with A < 0, or
                         # above 1 + eps_high with A > 0 (TRL's "clip ratio region")
  kl: jax.Array          # k_t (0 where beta is 0)


def token_terms(log_probs: jax.Array, old_log_probs: jax.Array, reference_log_probs: jax.Array
                | None, advantages: jax.Array, mask: jax.Array, *, epsilon_low: float,
                epsilon_high: float, kl_coef: float, importance: str) -> Terms:
  """The surrogate, ratio, clip indicator and KL of each token (module doc)."""
  log_ratio = log_probs - old_log_probs
  if importance == "sequence":
    log_weight = (jnp.sum(log_ratio * mask, axis=-1, keepdims=True)
                  / jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0))
  else:
    log_weight = log_ratio
  ratio = jnp.broadcast_to(jnp.exp(log_weight), log_probs.shape)
  clipped_ratio = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
  advantage = advantages[:, None]
  loss = -jnp.minimum(ratio * advantage, clipped_ratio * advantage)
  kl = jnp.zeros_like(log_probs)
  if kl_coef:
    delta = reference_log_probs - log_probs
    kl = jnp.exp(delta) - delta - 1.0
    loss = loss + kl_coef * kl
  clipped = (((ratio < 1.0 - epsilon_low) & (advantage < 0))
             | ((ratio > 1.0 + epsilon_high) & (advantage > 0)))
  return Terms(loss, ratio, jax.lax.stop_gradient(clipped.astype(jnp.float32)),
               jax.lax.stop_gradient(kl))


def loss_sum(token_loss: jax.Array, mask: jax.Array, aggregation: str) -> jax.Array:
  """The numerator of the aggregated loss over these rows (the denominator is `normalizer`'s,
  of the whole batch, so micro-batches add up to the batch): the sum of each row's token mean
  ("sequence"), else the sum over the masked tokens."""
  masked = token_loss * mask
  if aggregation == "sequence":
    return jnp.sum(jnp.sum(masked, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0))
  return jnp.sum(masked)


def normalizer(mask: jax.Array, aggregation: str, max_new_tokens: int) -> jax.Array:
  """What the whole batch's `loss_sum` is divided by: its completions ("sequence"), its
  completion tokens ("token", at least 1), or completions * max_new_tokens ("constant")."""
  rows = jnp.asarray(mask.shape[0], jnp.float32)
  if aggregation == "sequence":
    return rows
  if aggregation == "constant":
    return rows * max_new_tokens
  return jnp.maximum(jnp.sum(mask), 1.0)


def entropy(logits: jax.Array) -> jax.Array:
  """The policy's entropy in nats at each position [rows, tokens] (no gradient: a metric)."""
  log_p = jax.nn.log_softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
