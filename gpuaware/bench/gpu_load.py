"""A GPU load for ``gpuaware/bench/nvml_check.py`` and ``gpuaware/bench/nvml_pipeline_check.py`` to read: bf16 matrix
products
(PyTorch, CUDA) for ``--seconds``, on about 0.4 GiB of the GPU's memory. Prints the TFLOP/s it reached."""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--n", type=int, default=8192, help="Matrix side.")
    args = ap.parse_args()
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    end, products, t0 = time.monotonic() + args.seconds, 0, time.monotonic()
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        products += 20
    secs = time.monotonic() - t0
    tflops = 2 * args.n ** 3 * products / secs / 1e12
    print(f"LOAD {products} products of {args.n}^3 in {secs:.1f} s: {tflops:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
