"""A plain Flax + optax decoder-only LM train step: the yardstick lingvo_lite is timed against.

Written the way a Flax user would write it from the documentation: linen's
MultiHeadDotProductAttention with a causal mask, pre-LayerNorm blocks, a GELU MLP without
biases, no position encoding, the output tied to the embedding (`Embed.attend`), mean
softmax cross-entropy, AdamW, one jitted step with donated state.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Shapes:
  num_layers: int = 4
  dim: int = 256
  num_heads: int = 4
  mlp_dim: int = 1024
  vocab_size: int = 8192
  sequence_length: int = 256
  batch_size: int = 8


class ReferenceBlock(nn.Module):
  shapes: Shapes

  @nn.compact
  def __call__(self, x, mask):
    s = self.shapes
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(
        num_heads=s.num_heads, qkv_features=s.dim, use_bias=False, deterministic=True)(
            h, mask=mask)
    h = nn.LayerNorm()(x)
    h = nn.gelu(nn.Dense(s.mlp_dim, use_bias=False)(h))
    return x + nn.Dense(s.dim, use_bias=False)(h)


class ReferenceLM(nn.Module):
  shapes: Shapes

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(self.shapes.vocab_size, self.shapes.dim)
    x = embed(tokens)
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.shapes.num_layers):
      x = ReferenceBlock(self.shapes)(x, mask)
    return embed.attend(nn.LayerNorm()(x))


def make_reference(shapes: Shapes, learning_rate: float = 3e-4, seed: int = 0,
                   in_shardings=None, out_shardings=None):
  """Returns (jitted step, params, opt_state); step(params, opt_state, batch) -> (p, o, loss).

  With shardings given, the step is jitted with them (the multi-device comparison).
  """
  model = ReferenceLM(shapes)
  tokens = jnp.zeros((shapes.batch_size, shapes.sequence_length), jnp.int32)
  params = model.init(jax.random.key(seed), tokens)
  optimizer = optax.adamw(learning_rate)
  opt_state = optimizer.init(params)

  def loss_fn(params, batch):
    logits = model.apply(params, batch["inputs"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  jit_kwargs = {}
  if in_shardings is not None:
    jit_kwargs = {"in_shardings": in_shardings, "out_shardings": out_shardings}
  return (jax.jit(step, donate_argnums=(0, 1), **jit_kwargs), params, opt_state)
