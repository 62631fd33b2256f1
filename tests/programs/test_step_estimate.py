"""The step-time estimate (programs/compile/step_estimate.py and its terms): the HLO parser on
hand-written modules, each term against a count made by hand (or, for a convolution's FLOPs,
by jax's own convolution of ones), loops by their trip counts, asynchronous overlap,
collectives over ICI and DCN, the pipeline bubble, and the report's lines for bound configs.
No compile of a model: everything runs on short HLO texts in this process."""

import dataclasses
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lingvo_lite import chips
from lingvo_lite.chips import Figure
from lingvo_lite.programs.compile import (collective_costs, estimate_report, hlo_costs,
                                          hlo_text, step_estimate)

# Round numbers, so that every expected time below is arithmetic on the page.
CHIP = dataclasses.replace(
    chips.CHIPS["v5e"], matmul_flops=Figure(100e12, "test"), hbm_bytes_per_s=Figure(1e11, "test"),
    hbm_read_bytes_per_s=None, op_overhead_s=Figure(1e-6, "test"),
    ici_link_bytes_per_s=Figure(50e9, "test"), dcn_bytes_per_s=Figure(3.125e9, "test"))
OVERHEAD = 1e-6
ADD = """%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}
"""


def _devices(slices, line=True):
  """Devices on one torus axis (coordinates 0, 1, 2, ...), in the given slices."""
  return [types.SimpleNamespace(slice_index=s, coords=(i if line else 0, 0, 0))
          for i, s in enumerate(slices)]


def _estimate(text, devices=None):
  return step_estimate.estimate(text, CHIP, devices or _devices([0]))


DOT = """HloModule m, is_scheduled=true

ENTRY %main (a: bf16[256,512], b: bf16[512,64]) -> bf16[256,64] {
  %a = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(0)
  %b = bf16[512,64]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  ROOT %dot = bf16[256,64]{1,0:T(8,128)(2,1)} dot(%a, %b), lhs_contracting_dims={1},
      rhs_contracting_dims={0}
}
"""


def test_the_parser_reads_shapes_tiles_memory_spaces_and_operands():
  module = hlo_text.parse(DOT)
  assert module.entry == "main"
  dot = module.instructions["dot"]
  assert (dot.opcode, dot.operands, dot.root) == ("dot", ["a", "b"], True)
  assert dot.attribute("lhs_contracting_dims") == "{1}"
  b = module.instructions["b"].shape[0]
  assert (b.dtype, b.dims, b.tile, b.memory_space) == ("bf16", (512, 64), (8, 128), 1)
  # A 64-wide minor dimension is stored padded to the 128-lane tile.
  assert dot.shape[0].bytes == 256 * 128 * 2
  assert module.instructions["a"].shape[0].bytes == 256 * 512 * 2


def test_a_matmul_is_the_larger_of_its_padded_mxu_time_and_its_hbm_time():
  flops = 2 * 256 * 512 * 64
  # The 64 output columns fill half of the 128-wide array; b lives in vector memory.
  mxu, moved = flops / 0.5 / 100e12, 256 * 512 * 2 + 256 * 128 * 2
  slow = _estimate(DOT)  # 100 GB/s of HBM: the bytes take longer than the MXU.
  assert slow.flops == flops and moved / 1e11 > mxu
  assert (slow.seconds["compute"], slow.hbm_bytes) == (0, moved)
  assert slow.seconds["memory"] == pytest.approx(moved / 1e11 + OVERHEAD)
  fast = step_estimate.estimate(DOT, dataclasses.replace(
      CHIP, hbm_bytes_per_s=Figure(1e13, "test")), _devices([0]))
  assert fast.seconds["memory"] == 0
  assert fast.seconds["compute"] == pytest.approx(mxu + OVERHEAD)


def test_convolution_and_dot_flops_equal_jaxs_own_count():
  """XLA prints a convolution's padding, strides and dilations; its multiply-adds are the
  sum of the same convolution of ones (each output counts the taps that meet real input)."""
  def conv(x, w):
    return lax.conv_general_dilated(
        x, w, window_strides=(2, 3), padding=[(1, 2), (0, 1)], lhs_dilation=(2, 1),
        rhs_dilation=(1, 2), dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=2)
  x, w = jnp.ones((2, 4, 7, 9)), jnp.ones((6, 2, 3, 2))
  module = hlo_text.parse(jax.jit(conv).lower(x, w).compile().as_text())
  convolution = next(i for i in module.instructions.values() if i.opcode == "convolution")
  flops, _, n, _ = hlo_costs.convolution_flops(module, convolution)
  assert flops == 2 * float(np.sum(conv(x, w)))
  assert n == 6
  a, b = jnp.ones((3, 5, 7)), jnp.ones((3, 7, 11))
  module = hlo_text.parse(jax.jit(lambda p, q: jnp.einsum("bij,bjk->bik", p, q)).lower(
      a, b).compile().as_text())
  dot = next(i for i in module.instructions.values() if i.opcode == "dot")
  assert hlo_costs.dot_flops(module, dot) == (2.0 * 3 * 5 * 7 * 11, 7, 11, 5)


def test_a_fusion_costs_the_slices_it_reads_and_the_update_it_writes():
  totals = _estimate("""HloModule m

%fused (p0: f32[8,1024], p1: s32[], p2: f32[8,1024], p3: f32[1,1024]) -> f32[8,1024] {
  %p0 = f32[8,1024]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  %ds = f32[1,1024]{1,0} dynamic-slice(%p0, %p1, %c0), dynamic_slice_sizes={1,1024}
  %p3 = f32[1,1024]{1,0} parameter(3)
  %sum.1 = f32[1,1024]{1,0} add(%ds, %p3)
  %p2 = f32[8,1024]{1,0} parameter(2)
  ROOT %dus = f32[8,1024]{1,0} dynamic-update-slice(%p2, %sum.1, %p1, %c0)
}

ENTRY %main (w: f32[8,1024], i: s32[], acc: f32[8,1024], g: f32[1,1024]) -> f32[8,1024] {
  %w = f32[8,1024]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %acc = f32[8,1024]{1,0} parameter(2)
  %g = f32[1,1024]{1,0} parameter(3)
  ROOT %f = f32[8,1024]{1,0} fusion(%w, %i, %acc, %g), kind=kLoop, calls=%fused
}
""")
  # Read: one row of w, the index, one row of g (acc is the buffer written in place);
  # written: the updated row.
  read, written = 4096 + 4 + 4096, 4096
  assert totals.hbm_bytes == read + written
  assert totals.seconds["memory"] == pytest.approx((read + written) / 1e11 + OVERHEAD)


LOOP = """HloModule m

%body (t: (s32[], f32[8,1024])) -> (s32[], f32[8,1024]) {
  %t = (s32[], f32[8,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[8,1024]{1,0} get-tuple-element(%t), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[8,1024]{1,0} exponential(%x)
  ROOT %out = (s32[], f32[8,1024]{1,0}) tuple(%next, %y)
}

%cond (t.1: (s32[], f32[8,1024])) -> pred[] {
  %t.1 = (s32[], f32[8,1024]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%t.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (x.1: f32[8,1024]) -> (s32[], f32[8,1024]) {
  %x.1 = f32[8,1024]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,1024]{1,0}) tuple(%zero, %x.1)
  ROOT %loop = (s32[], f32[8,1024]{1,0}) while(%init), condition=%cond, body=%body%CONFIG%
}
"""


def test_a_loop_counts_its_body_once_per_trip():
  kernel = 2 * 8 * 1024 * 4 / 1e11 + OVERHEAD  # exp reads and writes 32 KiB
  bounds = _estimate(LOOP.replace("%CONFIG%", ""))
  assert bounds.seconds["memory"] == pytest.approx(5 * kernel)
  assert bounds.kernels == 5
  known = _estimate(LOOP.replace("%CONFIG%", ', backend_config={"known_trip_count":{"n":"7"}}'))
  assert known.seconds["memory"] == pytest.approx(7 * kernel)
  # XLA unrolls a loop by stepping its counter by 2: 0, 2, 4 are below 5.
  unrolled = _estimate(LOOP.replace("%CONFIG%", "").replace("constant(1)", "constant(2)"))
  assert unrolled.seconds["memory"] == pytest.approx(3 * kernel)
  module = hlo_text.parse(LOOP.replace("%CONFIG%", "").replace("constant(5)", "constant(-5)"))
  assert hlo_text.trip_count(module, module.instructions["loop"]) == 0


def _all_reduce(groups, elements=1024, start=False):
  op = "all-reduce-start" if start else "all-reduce"
  between = ("  %e = f32[8,1024]{1,0} exponential(%z)\n" if start else "")
  done = ("  ROOT %d = f32[%N%]{0} all-reduce-done(%ar)\n" if start else "")
  return (f"HloModule m\n\n{ADD}\nENTRY %main (p: f32[%N%], z: f32[8,1024]) -> f32[%N%] {{\n"
          "  %p = f32[%N%]{0} parameter(0)\n  %z = f32[8,1024]{1,0} parameter(1)\n"
          f"  {'' if start else 'ROOT '}%ar = f32[%N%]{{0}} {op}(%p), "
          f"replica_groups={groups}, to_apply=%add\n{between}{done}}}\n").replace(
              "%N%", str(elements))


def test_an_all_reduce_moves_its_ring_bytes_over_the_links_its_groups_cross():
  size = 4096.0
  # Two groups of two on one torus axis: a bidirectional ring, 2(n-1)/n of the array.
  line = _estimate(_all_reduce("{{0,1},{2,3}}"), _devices([0, 0, 0, 0]))
  assert line.ici_bytes == size and line.dcn_bytes == 0
  assert line.seconds["ici"] == pytest.approx(size / (2 * 50e9) + OVERHEAD)
  # The same groups across two slices: all of it over the data-center network.
  across = _estimate(_all_reduce("{{0,2},{1,3}}"), _devices([0, 0, 1, 1]))
  assert (across.ici_bytes, across.dcn_bytes) == (0, size)
  assert across.seconds["dcn"] == pytest.approx(size / 3.125e9 + OVERHEAD)
  # One group of 4 over 2 slices: the slice's pair over ICI, then half each across slices.
  both = _estimate(_all_reduce("{{0,1,2,3}}"), _devices([0, 0, 1, 1]))
  assert (both.ici_bytes, both.dcn_bytes) == (size, size / 2)


def test_an_asynchronous_collective_adds_only_what_the_kernels_between_do_not_hide():
  kernel = 2 * 8 * 1024 * 4 / 1e11 + OVERHEAD
  small = _estimate(_all_reduce("{{0,1}}", start=True), _devices([0, 0]))
  transfer = 4096 / (2 * 50e9) + OVERHEAD
  assert small.seconds["ici"] == 0 and small.hidden["ici"] == pytest.approx(transfer)
  large = _estimate(_all_reduce("{{0,1}}", elements=1 << 20, start=True), _devices([0, 0]))
  transfer = 4 * (1 << 20) / (2 * 50e9) + OVERHEAD
  assert large.seconds["ici"] == pytest.approx(transfer - kernel)
  assert large.total == pytest.approx(transfer)


# XLA:TPU's asynchronous collective fusions (a windowed einsum's): a start, fusions that each
# hold the same collective (its channel) and advance it beside their own work, and a done.
# Each piece calls a computation of its own (`_gather`), and each loop's names are its own.
GATHER = """%%NAME% (%P%: f32[1024]) -> f32[2048] {
  %%P% = f32[1024]{0} parameter(0)
  ROOT %%NAME%.ag = f32[2048]{0} all-gather(%%P%), channel_id=7, replica_groups={{0,1}},
      dimensions={0}
}
"""
COUNTED_LOOP = """%%NAME% (%NAME%.t: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %%NAME%.t = (s32[], f32[1024]{0}) parameter(0)
  %%NAME%.i = s32[] get-tuple-element(%%NAME%.t), index=0
  %x = f32[1024]{0} get-tuple-element(%%NAME%.t), index=1
  %%NAME%.one = s32[] constant(1)
  %%NAME%.next = s32[] add(%%NAME%.i, %%NAME%.one)
%BODY%  ROOT %%NAME%.out = (s32[], f32[1024]{0}) tuple(%%NAME%.next, %x)
}

%%NAME%.cond (%NAME%.c: (s32[], f32[1024])) -> pred[] {
  %%NAME%.c = (s32[], f32[1024]{0}) parameter(0)
  ROOT %%NAME%.lt = pred[] constant(true)
}
"""


def _gather(name):
  return GATHER.replace("%NAME%", name).replace("%P%", name + ".p")


def _counted_loop(name, body):
  return COUNTED_LOOP.replace("%BODY%", body).replace("%NAME%", name)


def _while(name, trips, into="x"):
  return (f"  %{name}.init = (s32[], f32[1024]{{0}}) tuple(%zero, %{into})\n"
          f"  %{name}.loop = (s32[], f32[1024]{{0}}) while(%{name}.init), condition=%{name}.cond, "
          f'body=%{name}, backend_config={{"known_trip_count":{{"n":"{trips}"}}}}\n')


def _async_module(loops, entry):
  return (f"HloModule m, is_scheduled=true\n\n" + "".join(_gather(n) for n in (
      "start_c", "more_c", "more_c.1", "done_c")) + "".join(loops) +
          "\nENTRY %main (x: f32[1024]) -> f32[1024] {\n  %x = f32[1024]{0} parameter(0)\n"
          f"  %zero = s32[] constant(0)\n{entry}  ROOT %out = f32[1024]{{0}} bitcast(%x)\n}}\n")


START = "  %async-collective-start = f32[2048]{0} fusion(%x), kind=kCustom, calls=%start_c\n"
DONE = ("  %async-collective-done = f32[2048]{0} fusion(%x), kind=kCustom, calls=%done_c\n")
MORE = ("  %more = f32[2048]{0} fusion(%x), kind=kOutput, calls=%more_c\n"
        "  %more.1 = f32[2048]{0} fusion(%x), kind=kOutput, calls=%more_c.1\n")


def test_an_asynchronous_collective_counts_once_per_start_across_loops_and_fusions():
  gather = 4096.0  # all-gather of 2: (2 - 1) x the 4 KiB input, moved once per start
  transfer = gather / (2 * 50e9) + OVERHEAD
  advance = (4096 + 8192) / 1e11 + OVERHEAD  # a continuation reads 4 KiB, writes 8 KiB
  # Micro-batches (4) x a start, a windowed loop (3 trips) continuing it twice a trip, a done.
  nested = _estimate(_async_module(
      [_counted_loop("inner", MORE), _counted_loop("outer", START + _while("inner", 3) + DONE)],
      _while("outer", 4)), _devices([0, 0]))
  assert nested.ici_bytes == 4 * gather
  assert nested.kernels == 4 * (1 + 3 * 2)  # a collective and six continuation kernels each
  assert nested.seconds["memory"] == pytest.approx(4 * 3 * 2 * advance)
  # The kernels of the windowed loop hide the transfer.
  assert nested.seconds["ici"] == 0 and nested.hidden["ici"] == pytest.approx(4 * transfer)
  # Continuations without the start's channel: XLA's own mark (their backend config) tells.
  marked = MORE.replace("calls=%more_c", 'backend_config={"continuation_config":{}}, '
                        "calls=%more_c")
  unnamed = _estimate(re.sub(r"(more_c\S* = .*), channel_id=7", r"\1", _async_module(
      [_counted_loop("inner", marked), _counted_loop("outer", START + _while("inner", 3) + DONE)],
      _while("outer", 4))), _devices([0, 0]))
  assert unnamed.ici_bytes == 4 * gather and unnamed.kernels == nested.kernels
  # Pipelined over a loop's trips: started before the loop and at the end of each trip, each
  # run waited for at the next trip's beginning (the last after the loop): 1 + 3 runs.
  pipelined = _estimate(_async_module(
      [_counted_loop("trip", DONE + MORE + START)], START + _while("trip", 3) + DONE),
      _devices([0, 0]))
  assert pipelined.ici_bytes == (1 + 3) * gather
  assert pipelined.seconds["memory"] == pytest.approx(3 * 2 * advance)
  # A start that is never waited for where it runs is counted whole there, once a trip.
  assert pipelined.seconds["ici"] + pipelined.hidden["ici"] == pytest.approx(4 * transfer)
  # Started again before its done: both runs move their bytes.
  again = _estimate(_async_module([], START + START.replace("start =", "start.1 =") + DONE),
                    _devices([0, 0]))
  assert again.ici_bytes == 2 * gather


def test_an_async_update_carries_its_start_to_the_done():
  totals = _estimate(f"""HloModule m, is_scheduled=true

{_gather("wrapped")}
ENTRY %main (x: f32[1024], z: f32[8,1024]) -> f32[2048] {{
  %x = f32[1024]{{0}} parameter(0)
  %z = f32[8,1024]{{1,0}} parameter(1)
  %as = ((f32[1024]{{0}}), f32[2048]{{0}}, u32[]) async-start(%x), calls=%wrapped
  %au = ((f32[1024]{{0}}), f32[2048]{{0}}, u32[]) async-update(%as), calls=%wrapped
  %e = f32[8,1024]{{1,0}} exponential(%z)
  ROOT %ad = f32[2048]{{0}} async-done(%au), calls=%wrapped
}}
""", _devices([0, 0]))
  kernel = 2 * 8 * 1024 * 4 / 1e11 + OVERHEAD  # the exponential, the only kernel
  assert totals.seconds["memory"] == pytest.approx(kernel) and totals.kernels == 2
  assert totals.seconds["ici"] == 0
  assert totals.hidden["ici"] == pytest.approx(4096 / (2 * 50e9) + OVERHEAD)


def test_a_multi_slice_programs_dcn_transfer_counts_across_its_slices():
  totals = _estimate("""HloModule m, num_partitions=4

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %tok = token[] after-all()
  %send = (f32[1024]{0}, u32[], token[]) send(%p, %tok), channel_id=3, is_host_transfer=true,
      frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",
      _xla_megascale_transfer_type="ALL_REDUCE"}
  %sd = token[] send-done(%send), channel_id=3, is_host_transfer=true
  ROOT %copy = f32[1024]{0} copy(%p)
}
""", _devices([0, 0, 0, 0, 1, 1, 1, 1]))
  assert totals.dcn_bytes == 4096  # 2 slices: 2 (2 - 1) / 2 of the array
  assert totals.seconds["dcn"] == pytest.approx(4096 / 3.125e9 + OVERHEAD)


def test_replica_groups_in_every_printed_form():
  def groups(text):
    return hlo_text.replica_groups(hlo_text.Instruction("x", "all-reduce", [], [], text))
  assert groups(", replica_groups={{0,1},{2,3}}") == [[0, 1], [2, 3]]
  assert groups(", replica_groups=[2,2]<=[4]") == [[0, 1], [2, 3]]
  assert groups(", replica_groups=[2,2]<=[2,2]T(1,0)") == [[0, 2], [1, 3]]
  assert groups(", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}") \
      == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert groups(", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}") == [
      [0, 4], [1, 5], [2, 6], [3, 7]]
  assert groups(", replica_groups={}") is None


def test_an_attention_kernel_counts_its_causal_blocks_at_the_head_widths_tile():
  totals = _estimate("""HloModule m

ENTRY %main (q: bf16[1,4,1024,64], k: bf16[1,1,1024,64], v: bf16[1,1,1024,64])
    -> bf16[1,4,1024,64] {
  %q = bf16[1,4,1024,64]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %k = bf16[1,1,1024,64]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  %v = bf16[1,1,1024,64]{3,2,1,0:T(8,128)(2,1)} parameter(2)
  ROOT %splash_mha_fwd.1 = bf16[1,4,1024,64]{3,2,1,0:T(8,128)(2,1)} custom-call(%q, %k, %v),
      custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 512, \\"block_kv\\": 512}"
}}, metadata={op_name="jit(f)/splash_mha_fwd/pallas_call"}
}
""")
  # Two matmuls over 2 x 2 blocks of 512, 3 on or below the diagonal.
  flops = 2 * 2 * 4 * 1024 * 1024 * 64 * 3 / 4
  assert totals.flops == flops
  # Heads of 64 are half the MXU's width; the bytes are the tiles' (64 padded to 128).
  read, written = (4 + 1 + 1) * 1024 * 128 * 2, 4 * 1024 * 128 * 2
  assert totals.seconds["compute"] + totals.seconds["memory"] == pytest.approx(
      max(flops / 0.5 / 100e12, (read + written) / 1e11) + OVERHEAD)


def test_the_pipeline_bubble_is_its_share_of_the_pipelined_loop():
  assert step_estimate.bubble_seconds(11.0, 4, 8) == pytest.approx(3.0)
  assert step_estimate.bubble_seconds(8.0, 4, 8, in_program=False) == pytest.approx(3.0)
  assert step_estimate.bubble_seconds(9.0, 1, 8) == 0.0
  assert step_estimate.bubble_seconds(11.0, 4, 4, repeats=2) == pytest.approx(3.0)
  kept = {"seconds": {"compute": 8.0, "memory": 3.0}}
  parts = step_estimate.pipelined(kept, 4, 8)
  assert parts["bubble"] == pytest.approx(3.0) and sum(parts.values()) == pytest.approx(11.0)
  assert parts["compute"] == pytest.approx(8.0 * 8 / 11)


def _kept(**seconds):
  return {"version": step_estimate.MODEL_VERSION,
          "seconds": {p: seconds.get(p, 0.0) for p in step_estimate.PARTS},
          "hidden": {"ici": 0.5}, "flops": 1e12, "hbm_bytes": 2e9, "ici_bytes": 3e6,
          "dcn_bytes": 4e6, "kernels": 10, "unknown_dcn": False}


def test_the_report_names_the_dominant_part_and_the_next_knob_of_a_bound_config():
  def report(kept, pipeline=(1, 1, 1)):
    section = estimate_report.section(kept, "TPU v5 lite", 98.5e12 * 0.5, 4096, pipeline)
    return section, "\n".join(estimate_report.lines(section))
  section, text = report(_kept(compute=1.0, memory=0.25))
  assert section["dominant"] == "compute" and section["bound"] is None
  assert section["seconds"] == 1.25 and section["mfu"] == pytest.approx(0.2)
  assert "compute 1000 ms (80%, dominates)" in text and "-bound" not in text
  section, text = report(_kept(compute=1.0, memory=2.0))
  assert section["bound"] == "memory"
  assert "\n  memory-bound: raise the per-device batch (train_data.global_batch_size)" in text
  section, text = report(_kept(compute=1.0, dcn=3.0))
  assert "\n  DCN-bound: shard the optimizer over the slices (partitioner.dcn_fsdp)" in text
  section, text = report(_kept(compute=1.0), pipeline=(8, 2, 1))
  assert section["bound"] == "bubble" and section["pipeline"]["bubble_fraction"] == (
      pytest.approx(7 / 9))
  assert "bubble-bound: more microbatches (train.pipeline_microbatches)" in text
  assert "8 stages x 2 microbatches" in text
  _, text = report({"error": "ValueError: bad"})
  assert "step time estimate: none: the optimized HLO could not be counted" in text
  section = estimate_report.section(_kept(compute=1.0), "cpu", 1.0, 1.0)
  assert not section["made"] and "no chip constants for cpu" in section["reason"]
  section = estimate_report.section(_kept(), "TPU v5 lite", 1.0, 1.0)
  assert not section["made"] and "no kernel to count" in section["reason"]


def test_text_that_is_no_hlo_module_counts_nothing_and_raises_nothing():
  for text in ("", "not HLO at all\n}\n", "ENTRY %e (a: f32[?,3]) -> f32[] {\n"
               "  %a = f32[?,3]{1,0} parameter(0)\n  %f = f32[2]{0} fusion(%a), calls=%gone\n"
               "  %w = f32[2]{0} while(%f), condition=%nowhere\n"
               "  ROOT %c = f32[2]{0} convolution(%a, %missing), dim_labels=zz\n}\n"):
    totals = _estimate(text)
    assert totals.flops == 0 and totals.seconds["compute"] == 0


def test_every_chip_constant_says_where_it_comes_from():
  assert chips.chip_of("TPU v5 lite").name == "v5e"
  assert chips.chip_of("TPU v6 lite").name == "v6e"
  assert chips.chip_of("cpu") is None
  for chip in chips.CHIPS.values():
    for field in dataclasses.fields(chip):
      value = getattr(chip, field.name)
      if isinstance(value, Figure):
        assert value.value > 0 and len(value.source) > 10, (chip.name, field.name)
  v5e = chips.CHIPS["v5e"]
  # A copy reads and writes each byte once at the measured copy bandwidth; a stream one way
  # (reads, or writes alone) at the read bandwidth.
  assert v5e.hbm_seconds(1e9, 1e9) == pytest.approx(2e9 / v5e.hbm_bytes_per_s.value)
  assert v5e.hbm_seconds(1e9, 0) == pytest.approx(1e9 / v5e.hbm_read_bytes_per_s.value)
  assert v5e.hbm_seconds(0, 1e9) == pytest.approx(1e9 / v5e.hbm_read_bytes_per_s.value)
  assert v5e.hbm_seconds(3e9, 1e9) == pytest.approx(
      2e9 / v5e.hbm_read_bytes_per_s.value + 2e9 / v5e.hbm_bytes_per_s.value)
  network = collective_costs.Network.of(_devices([0, 0, 1, 1]), partitions=2)
  assert (network.size, network.slice_count) == (2, 2)
