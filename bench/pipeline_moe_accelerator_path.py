"""The pipelined mixture of experts on the accelerators' grouped matmul, against one device: on
a CPU the dropless experts run tiles of rows (`expert_dispatch._tiled_grouped`), so the suite's
pipeline numerics (tests/pipeline_worker.py) never meet `grouped_matmul.ragged_dot` and its
fold of the stages' `vmap`. Here the dispatch's platform is forced to "tpu" (XLA:CPU runs
`ragged_dot` too, as a dense matmul per expert) for PyCodeMixtralTiny's 3 steps of gradient
descent, on 8 forced CPU devices, for three pipelines (circular, GPipe over fsdp x tensor, and
the expert axis).

  python bench/pipeline_moe_accelerator_path.py

Prints each case's largest relative distance of the loss and of the gradients (the suite's
bound is 1e-5); exits 1 above it.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
from bench import pipeline_numerics  # noqa: E402
from lingvo_lite.models import expert_dispatch  # noqa: E402
from tests import pipeline_worker as worker  # noqa: E402

# (mesh axes, repeats, microbatches)
CASES = {"stage4_data2/circular": (worker.MESHES["stage4_data2"], 2, 4),
         "stage2_fsdp2_tensor2/gpipe": (worker.MESHES["stage2_fsdp2_tensor2"], 1, 2),
         "stage2_data2_expert2/gpipe": (dict(stage=2, data=2, expert=2), 1, 2)}


def main() -> int:
  expert_dispatch.current_platform = lambda: "tpu"
  started = time.perf_counter()
  reference = worker._trajectory("PyCodeMixtralTiny", worker.MOE_SETS)  # pylint: disable=protected-access
  distances = {}
  for name, (mesh, repeats, microbatches) in CASES.items():
    case = worker._trajectory("PyCodeMixtralTiny", worker.MOE_SETS, mesh, repeats,  # pylint: disable=protected-access
                              microbatches, start=reference[3])
    distances[name] = worker._distance(reference, case)  # pylint: disable=protected-access
  return pipeline_numerics.print_distances(distances, f"{time.perf_counter() - started:.0f} s",
                                           width=30)


if __name__ == "__main__":
  sys.exit(main())
