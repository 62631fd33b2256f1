"""The shapes of the project's step-time benchmark (bench/step_bench.py), as experiments.

  python bench/step_bench.py            # lingvo_lite vs a plain Flax + optax step
"""

import fiddle as fdl

from lingvo_lite.config.registry import register
from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.training.optimizers import AdamW


@register
class BenchSmall(Experiment):
  """Benchmark shapes: 4 pre-LN blocks, d_model 256, 4 heads, MLP 1024, seq 256, batch 8.

  Tied embeddings over 8192 tokens, no biases, GELU, float32, AdamW without clipping and
  without a gradient-norm metric, on synthetic tokens: the plain reference step of
  bench/step_bench.py has the same shapes and does the same work.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    vocab, sequence_length, batch = 8192, 256, 8
    return setup_config(
        model=fdl.Config(
            TransformerLM, vocab_size=vocab, num_layers=4, dim=256, num_heads=4,
            mlp_dim=1024, block="sequential", norm="layernorm", mlp_activation="gelu_tanh",
            position="none", attention_bias=False, mlp_bias=False, tie_embeddings=True,
            # The reference step's PaLM-style tied output: unit-scale rows, logits / sqrt(dim).
            embedding_init_stddev=1.0, tied_output_scale="rsqrt_dim"),
        optimizer=fdl.Config(AdamW, peak_learning_rate=3e-4, warmup_steps=10,
                             weight_decay=1e-4, clip_grad_norm=None),
        train_data=fdl.Config(SyntheticData, vocab_size=vocab,
                              sequence_length=sequence_length, global_batch_size=batch),
        # The reference computes no gradient norm; neither does this step (equal work).
        train=fdl.Config(TrainLoop, steps=100, log_every_steps=10, log_grad_norm=False),
    )


@register
class BenchLarge(BenchSmall):
  """Larger benchmark shapes: 8 layers, d_model 512, 8 heads, MLP 2048, seq 512, vocab 32000.

  python bench/step_bench.py --experiment=BenchLarge
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model.num_layers, cfg.model.dim, cfg.model.num_heads = 8, 512, 8
    cfg.model.mlp_dim, cfg.model.vocab_size = 2048, 32000
    cfg.train_data.vocab_size, cfg.train_data.sequence_length = 32000, 512
    return cfg
