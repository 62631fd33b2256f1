"""A family's tensors in other formats as rows: our parameters, the Hugging Face tensor that holds
them, the GGUF tensor(s) llama.cpp's converter makes of it, and how each is laid out.

  Tensor("layer_{i}/attention/query_kernel", "model.layers.{i}.self_attn.q_proj.weight",
         "blk.{i}.attn_q.weight", rotary="query")

is, for each layer i, the Hugging Face tensor (an `nn.Linear` weight, [out, in]) holding our
query kernel ([dim, heads, head_dim]), and the GGUF tensor llama.cpp's converter makes of it
(its `llama` puts each head's rotary pairs side by side: `rotary`). A pattern with `{i}` is one
tensor per layer, with `{expert}` one per expert (a row of our stacked parameter; GGUF stacks
them again). The rows of a table expand in order, a run of per-layer rows layer by layer
(`hf_tensors`, `gguf_tensors`): the order a Hugging Face folder's tensors are read and hashed
in (a source's fingerprint), which a family's table keeps.

The conversions are checkpoint_names.py's `TensorName` (ours <-> Hugging Face) and `GgufTensor`
(Hugging Face <-> GGUF), made from the rows here, so import, export and both formats read one
table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from lingvo_lite.errors import UsageError
from lingvo_lite.models.checkpoint_names import GgufTensor, TensorName

# When a row holds a tensor: (model, layer index or None) -> bool.
When = Callable[[Any, "int | None"], bool]


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One tensor of each format and the parameters it holds.

  Attributes:
    ours: Our parameter path(s), in the order they lie along the tensor's output axis (several
      for a fused tensor).
    hf: The Hugging Face tensor's name.
    gguf: The GGUF tensor's name; several: the Hugging Face tensor's last-axis columns split
      among them, alternating (gpt-oss's gate and up); None: no GGUF tensor (a model that
      has this one cannot be read or written as GGUF).
    input_axes: How many leading axes of each parameter make the matrix's input axis
      (`TensorName`): 1 for a kernel, 2 for an output kernel [heads, head_dim, dim], 0 for a
      vector.
    transposed: The Hugging Face tensor is [out, in] (torch's `nn.Linear`), not [in, out]
      (GPT-2's `Conv1D`, gpt-oss's experts); GGUF stores every matrix [out, in].
    table: Indexed by token or position (an embedding): stored as it is in every format.
    norm: A norm's scale (a GGUF architecture may store it offset: Gemma's 1 + weight).
    rotary: "query" or "key": a projection whose rows llama.cpp's `llama` rearranges into
      GGML's rotary pairs, over the query or key/value heads.
    interleaved: Fused parameters alternate column by column (`TensorName.interleaved`).
    stacked: Leading axes the tensor keeps ([experts, in, out]: `TensorName.stacked`).
    when: The model (and layer) has this tensor; None: always.
  """

  ours: str | tuple[str, ...]
  hf: str
  gguf: str | tuple[str, ...] | None = None
  input_axes: int = 1
  transposed: bool = True
  table: bool = False
  norm: bool = False
  rotary: str | None = None
  interleaved: bool = False
  stacked: int = 0
  when: When | None = None

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf

  @property
  def paths(self) -> tuple[str, ...]:
    return (self.ours,) if isinstance(self.ours, str) else self.ours

  def held(self, model: Any, layer: int | None) -> bool:
    return self.when is None or self.when(model, layer)

  def tensor_names(self, model: Any, layer: int | None) -> list[TensorName]:
    """Its Hugging Face tensor(s) of `layer` as `TensorName`s (one per expert where the name
    has `{expert}`)."""
    paths = tuple(path.format(i=layer) for path in self.paths)
    name = self.hf.format(i=layer, expert="{expert}")
    made = dict(input_axes=self.input_axes, transposed=self.transposed and not self.table,
                interleaved=self.interleaved, stacked=self.stacked)
    if "{expert}" not in name:
      return [TensorName(name, paths, **made)]
    return [TensorName(name.format(expert=e), paths, expert=e, **made)
            for e in range(model.num_experts)]

  def gguf_tensors(self, model: Any, layer: int | None, rotary_pairs: bool,
                   norm_offset: float) -> dict[str, GgufTensor]:
    """Its GGUF tensor(s) of `layer`, as the Hugging Face tensor(s) they are."""
    hf = self.hf.format(i=layer, expert="{expert}")
    heads = None
    if rotary_pairs and self.rotary:
      heads = model.num_heads if self.rotary == "query" else model.resolved_num_kv_heads
    made = dict(
        rotary_heads=heads,
        transposed=not self.transposed and self.input_axes > 0 and not self.table,
        offset=norm_offset if self.norm else 0.0,
        experts=model.num_experts if "{expert}" in hf else 0)
    names = (self.gguf,) if isinstance(self.gguf, str) else self.gguf
    return {name.format(i=layer): GgufTensor(
        hf, columns=(index, len(names)) if len(names) > 1 else None, **made)
            for index, name in enumerate(names)}


def _expanded(rows: tuple[Tensor, ...], model: Any) -> list[tuple[Tensor, int | None]]:
  """(row, layer) of every tensor the model has: runs of per-layer rows layer by layer, the
  others once, in the table's order."""
  found: list[tuple[Tensor, int | None]] = []
  start = 0
  while start < len(rows):
    end = start
    while end < len(rows) and rows[end].per_layer == rows[start].per_layer:
      end += 1
    run = rows[start:end]
    layers = range(model.num_layers) if run[0].per_layer else (None,)
    found += [(row, layer) for layer in layers for row in run if row.held(model, layer)]
    start = end
  return found


def hf_tensors(rows: tuple[Tensor, ...], model: Any) -> list[TensorName]:
  """Every Hugging Face tensor of `model` (unrolled layers), in the table's order."""
  return [name for row, layer in _expanded(rows, model)
          for name in row.tensor_names(model, layer)]


def gguf_tensors(rows: tuple[Tensor, ...], model: Any, architecture: str, rotary_pairs: bool,
                 norm_offset: float) -> dict[str, GgufTensor]:
  """Every GGUF tensor of `model` by name, in the table's order.

  Raises:
    UsageError: the model has a tensor the architecture has none for (one line naming it).
  """
  found: dict[str, GgufTensor] = {}
  for row, layer in _expanded(rows, model):
    if row.gguf is None:
      paths = ", ".join(path.format(i=layer) for path in row.paths)
      raise UsageError(f"model: a GGUF {architecture} file has no tensor for "
                       f"{row.hf.format(i=layer, expert=0)} ({paths}); read or write this "
                       "model as a Hugging Face folder (hf:PATH, --export_format=hf)")
    found.update(row.gguf_tensors(model, layer, rotary_pairs, norm_offset))
  return found


# ------------------------------------------------------------------------------ helpers


def _part(gguf: str | None | bool, suffix: str) -> str | None:
  """A GGUF name made of `gguf` and `suffix`; None where there is no GGUF name."""
  return f"{gguf}{suffix}" if gguf else None


def has(field: str, value: Any = True) -> When:
  """A row the model has where its `field` is `value` (a bias, an untied output)."""
  return lambda model, layer: getattr(model, field) == value


def where(when: When, rows: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
  """`rows`, each held only where `when` says too (a mixture of experts' layer kinds)."""
  return tuple(dataclasses.replace(row, when=when if row.when is None else (
      lambda model, layer, row=row: when(model, layer) and row.when(model, layer)))
               for row in rows)


def vector(ours: str, hf: str, gguf: str | tuple[str, ...] | None = None, **options: Any
           ) -> Tensor:
  """A vector stored as it is (a bias)."""
  return Tensor(ours, hf, gguf, input_axes=0, transposed=False, **options)


def norm(ours: str, hf: str, gguf: str | None, bias: bool = False) -> tuple[Tensor, ...]:
  """A norm's scale (`hf`.weight, `gguf`.weight) and, for a LayerNorm, its offset (.bias)."""
  scale = vector(f"{ours}/scale", f"{hf}.weight", _part(gguf, ".weight"), norm=True)
  return (scale, vector(f"{ours}/bias", f"{hf}.bias", _part(gguf, ".bias"))) if bias \
      else (scale,)


def dense(ours: str, hf: str, gguf: str | None, bias: When | bool = False,
          transposed: bool = True, gguf_bias: bool = False) -> tuple[Tensor, ...]:
  """A dense layer's kernel (`hf`.weight) and its bias where `bias` says (a condition, or
  always): torch's `nn.Linear`, or GPT-2's `Conv1D` (`transposed=False`). The bias has a GGUF
  tensor where `gguf_bias`."""
  kernel = Tensor(f"{ours}/kernel", f"{hf}.weight", _part(gguf, ".weight"),
                  transposed=transposed)
  if bias is False:
    return (kernel,)
  return (kernel, vector(f"{ours}/bias", f"{hf}.bias", _part(gguf_bias and gguf, ".bias"),
                         when=None if bias is True else bias))


def attention(hf: str, projections: tuple[str, str, str, str], gguf: str | None,
              bias: When | bool = False, gguf_bias: bool = False, ours: str = "layer_{i}/"
              ) -> tuple[Tensor, ...]:
  """Query, key, value and output projections stored as four `nn.Linear`s under `hf` (named
  `projections`, in that order), llama.cpp's attn_q, attn_k, attn_v and attn_output under
  `gguf` (llama's rearranging the query and key rows), with biases where `bias` says."""
  rows: tuple[Tensor, ...] = ()
  for projection, kind, theirs, rotary in zip(
      projections, ("query", "key", "value", "out"), ("q", "k", "v", "output"),
      ("query", "key", None, None)):
    gguf_name = _part(gguf, f"attn_{theirs}")
    rows += (Tensor(f"{ours}attention/{kind}_kernel", f"{hf}{projection}.weight",
                    _part(gguf_name, ".weight"), 2 if kind == "out" else 1, rotary=rotary),)
    if bias is not False:
      rows += (vector(f"{ours}attention/{kind}_bias", f"{hf}{projection}.bias",
                      _part(gguf_bias and gguf_name, ".bias"),
                      when=None if bias is True else bias),)
  return rows
