"""What one accelerator chip can do, each figure with where it comes from: the constants the
step-time estimate (programs/compile/step_estimate.py) divides by.

A figure is a datasheet's (Google Cloud's TPU pages) or measured on the lent TPU v5e with the
command that measured it. Where a generation has no measurement, its rate is the datasheet's
times the fraction v5e's measurement reached of v5e's datasheet (said so in its source), the
one assumption the table makes: the same compiler on the same kind of systolic array and HBM.

  | chip | bf16 peak | matmul used | HBM copy / reads (datasheet) | ICI link | links | DCN/chip |
  |---|---|---|---|---|---|---|
  | v5e | 197 TFLOP/s | 167.9 measured | 554 / 698 GB/s measured (819) | 50 GB/s | 4 | 3.125 GB/s |
  | v5p | 459 | 391 scaled | 1,870 / 2,357 scaled (2,765) | 100 GB/s | 6 | 6.25 GB/s |
  | v4 | 275 | 234 scaled | 812 / 1,023 scaled (1,200) | 50 GB/s | 6 | unpublished |
  | v6e | 918 | 782 scaled | 1,108 / 1,396 scaled (1,638) | 100 GB/s | 4 | 12.5 GB/s |

(An ICI link's bandwidth is one way; v5e and v6e are 2D tori, v4 and v5p 3D.)
"Copy" is bytes read plus written by an elementwise copy; "reads" is a kernel that only reads
(HBM turns around between reads and writes: the copy's writes are the slower part, so a
kernel's time is its reads at the read bandwidth plus its writes at what the copy leaves for
them). The per-kernel overhead (1.2 us) is XLA:TPU's own cost model's until the chip measures
it (bench/estimate_calibration.py). The MXUs: v4, v5e and v5p have 128 x 128 systolic arrays,
v6e 256 x 256; a matmul's contraction and output width are padded to that edge.

ICI per link and direction is the datasheet's bidirectional bandwidth per chip divided by its
ports and two directions (v5e: 400 GB/s / 4 ports / 2). DCN per chip is the host's NICs shared
by its chips (v5e: 2 x 100 Gb/s for 8 chips = 25 Gb/s; the pod's 6.4 Tb/s over 256 chips says
the same).
"""

from __future__ import annotations

import dataclasses

V5E_PAGE = "cloud.google.com/tpu/docs/v5e"
V5P_PAGE = "cloud.google.com/tpu/docs/v5p"
V4_PAGE = "cloud.google.com/tpu/docs/v4"
V6E_PAGE = "cloud.google.com/tpu/docs/v6e"
_MATMUL_COMMAND = ("bench/accelerator_mfu.py's best of 10 bfloat16 8192^3 matmuls on the lent "
                   "v5e, 2026-12-06 (bash bench/tpu_check.sh train)")
_COPY_COMMAND = ("bench/tpu_decode.py's copy_bandwidth() on the lent v5e, 2026-12-06 (bytes read "
                 "+ written by a 1 GiB elementwise copy; bash bench/tpu_check.sh decode)")
# v5e's measured fractions of its datasheet, which scale the generations nobody measured.
_V5E_MATMUL_FRACTION = 167.9 / 197.0
_V5E_COPY_FRACTION = 554.0 / 819.0
_V5E_READ_FRACTION = 698.0 / 819.0


@dataclasses.dataclass(frozen=True)
class Figure:
  """A number and where it comes from."""

  value: float
  source: str


@dataclasses.dataclass(frozen=True)
class Chip:
  """One generation's chip (per device as JAX counts them: v4 and v5p's two TensorCores act as
  one megacore device).

  Attributes:
    name: The generation (`v5e`).
    device_kinds: JAX's `device_kind` prefixes of its devices.
    peak_flops: Datasheet dense bf16 FLOP/s.
    matmul_flops: The bf16 FLOP/s a large, perfectly tiled matmul reaches.
    int8_speedup: int8 matmuls' rate over bf16's (datasheet peaks).
    hbm_bytes_per_s: Bytes/s read plus written by memory-bound work.
    hbm_datasheet: The datasheet's HBM bandwidth, beside it.
    mxu_edge: The systolic array's edge (128 x 128 arrays: 128); a matmul's contraction and
      output width are padded to it.
    ici_link_bytes_per_s: One ICI link's bandwidth in one direction.
    ici_links: ICI ports per chip.
    dcn_bytes_per_s: The data-center network's bandwidth per chip (None where unpublished).
    op_overhead_s: Fixed time per kernel the chip launches (pipeline fill and drain, DMA set-up).
  """

  name: str
  device_kinds: tuple[str, ...]
  peak_flops: Figure
  matmul_flops: Figure
  int8_speedup: float
  hbm_bytes_per_s: Figure
  hbm_datasheet: Figure
  mxu_edge: int
  ici_link_bytes_per_s: Figure
  ici_links: int
  dcn_bytes_per_s: Figure | None
  op_overhead_s: Figure
  hbm_read_bytes_per_s: Figure | None = None

  def hbm_seconds(self, read: float, written: float) -> float:
    """Seconds to read and write these bytes of HBM. A stream one way (only reads, or the
    writes beyond what is also read) runs at the read bandwidth where one is known; the bytes
    read and written in equal share, at the copy bandwidth (a copy reads and writes each byte
    once); without a read bandwidth, everything at the copy bandwidth.

    Writes alone once went at what the copy left for them (459 GB/s on v5e); the chip
    measured kernels that only write at 685 GB/s, about the read bandwidth (the written-out
    attention's score-writing fusions, bench/estimate_calibration.py --profile, 2026-12-07:
    bench/results/2026-12-07/tpu2/estimate_profile/). Some kernels that read and write alike
    ran faster than the copy too (671 GB/s); counting those at the read bandwidth as well put
    two of the README's seven training rows 10-11% under their measured steps, so the copy's
    rate stays for them until what else those rows miss is found."""
    copy = self.hbm_bytes_per_s.value
    if self.hbm_read_bytes_per_s is None:
      return (read + written) / copy
    both = min(read, written)
    return (read + written - 2 * both) / self.hbm_read_bytes_per_s.value + 2 * both / copy


def _scaled(datasheet: float, fraction: float, what: str) -> Figure:
  return Figure(datasheet * fraction, f"not measured: the datasheet's {datasheet:g} x "
                f"{fraction:.3f}, the fraction of its datasheet v5e's measured {what} reached")


_OVERHEAD = Figure(1.2e-6, "XLA:TPU's own cost model: its floor for a small kernel, 1,832 "
                   "cycles at v5e's 1.5 GHz (the 10th percentile of the optimized HLO's "
                   "estimated_cycles over the SmolLM2 row's kernels under 64 KiB); "
                   "bench/estimate_calibration.py measures it on the chip")
_READ_COMMAND = ("bench/tpu_decode.py on the lent v5e, 2026-12-06: batch-1 decode of the "
                 "head-128 shape read its 946 MB of parameters each step at 126% of the "
                 "copy bandwidth (reads only)")

CHIPS: dict[str, Chip] = {
    "v5e": Chip(
        "v5e", ("TPU v5 lite", "TPU v5e"), peak_flops=Figure(197e12, V5E_PAGE),
        matmul_flops=Figure(167.9e12, _MATMUL_COMMAND), int8_speedup=2.0,
        hbm_bytes_per_s=Figure(554e9, _COPY_COMMAND), hbm_datasheet=Figure(819e9, V5E_PAGE),
        hbm_read_bytes_per_s=Figure(698e9, _READ_COMMAND), mxu_edge=128,
        ici_link_bytes_per_s=Figure(
            50e9, f"{V5E_PAGE}: 400 GB/s bidirectional ICI per chip / 4 ports / 2"),
        ici_links=4, dcn_bytes_per_s=Figure(
            3.125e9, f"{V5E_PAGE}: 2 x 100 Gb/s NICs per host of 8 chips"),
        op_overhead_s=_OVERHEAD),
    "v5p": Chip(
        "v5p", ("TPU v5p", "TPU v5"), peak_flops=Figure(459e12, V5P_PAGE),
        matmul_flops=_scaled(459e12, _V5E_MATMUL_FRACTION, "matmul"), int8_speedup=2.0,
        hbm_bytes_per_s=_scaled(2765e9, _V5E_COPY_FRACTION, "copy"),
        hbm_datasheet=Figure(2765e9, V5P_PAGE),
        hbm_read_bytes_per_s=_scaled(2765e9, _V5E_READ_FRACTION, "reads"), mxu_edge=128,
        ici_link_bytes_per_s=Figure(
            100e9, f"{V5P_PAGE}: 1,200 GB/s bidirectional ICI per chip / 6 ports / 2"),
        ici_links=6, dcn_bytes_per_s=Figure(6.25e9, f"{V5P_PAGE}: 50 Gb/s DCN per chip"),
        op_overhead_s=_OVERHEAD),
    "v4": Chip(
        "v4", ("TPU v4",), peak_flops=Figure(275e12, V4_PAGE),
        matmul_flops=_scaled(275e12, _V5E_MATMUL_FRACTION, "matmul"), int8_speedup=1.0,
        hbm_bytes_per_s=_scaled(1200e9, _V5E_COPY_FRACTION, "copy"),
        hbm_datasheet=Figure(1200e9, V4_PAGE),
        hbm_read_bytes_per_s=_scaled(1200e9, _V5E_READ_FRACTION, "reads"), mxu_edge=128,
        ici_link_bytes_per_s=Figure(
            50e9, "TPU v4 paper (Jouppi et al., ISCA 2023): 6 ICI links of 400 Gb/s each way"),
        ici_links=6, dcn_bytes_per_s=None, op_overhead_s=_OVERHEAD),
    "v6e": Chip(
        "v6e", ("TPU v6 lite", "TPU v6e"), peak_flops=Figure(918e12, V6E_PAGE),
        matmul_flops=_scaled(918e12, _V5E_MATMUL_FRACTION, "matmul"), int8_speedup=2.0,
        hbm_bytes_per_s=_scaled(1638e9, _V5E_COPY_FRACTION, "copy"),
        hbm_datasheet=Figure(1638e9, V6E_PAGE),
        hbm_read_bytes_per_s=_scaled(1638e9, _V5E_READ_FRACTION, "reads"), mxu_edge=256,
        ici_link_bytes_per_s=Figure(
            100e9, f"{V6E_PAGE}: 800 GB/s bidirectional ICI per chip / 4 ports / 2"),
        ici_links=4, dcn_bytes_per_s=Figure(
            12.5e9, f"{V6E_PAGE}: 4 x 200 Gb/s NICs per host of 8 chips"),
        op_overhead_s=_OVERHEAD),
}


def chip_of(device_kind: str) -> Chip | None:
  """The chip whose devices JAX names `device_kind`, or None (a CPU, a GPU)."""
  for chip in CHIPS.values():
    if any(device_kind.startswith(kind) for kind in chip.device_kinds):
      return chip
  return None
