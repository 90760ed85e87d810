"""A deterministic PyTorch training loop on the GPU: per-step losses, then a checksum of the final weights.

    python3 torch_train.py [--model mlp|cnn] [--steps N] [--step-ms MS] [--graph]

Deterministic (torch.use_deterministic_algorithms, a fixed seed, batches made on the CPU): two runs on one GPU
print the same bits, so a run through nvproxy, or one checkpointed, migrated or recovered mid-way, must print
exactly what a native run prints.  --step-ms pauses after each step (a run long enough to be checkpointed while
it goes on).  --graph also replays a CUDA graph of the model's forward pass (torch.cuda.CUDAGraph) each step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (deterministic cuBLAS, as PyTorch asks)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

BATCH = 64


def model_of(kind: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The network and the shape of one input sample."""
    if kind == "mlp":
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)), (256,)
    if kind == "cnn":  # (convolutions: cuDNN)
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(32, 10)), (3, 32, 32)
    raise SystemExit(f"torch_train: no model {kind!r} (mlp or cnn)")


def batch(step: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn((BATCH, *shape), generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--graph", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    model, shape = model_of(args.model)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    graph = static_in = static_out = None
    if args.graph:
        static_in = torch.zeros((BATCH, *shape), device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():  # (warm-up outside the capture, as PyTorch asks)
            for _ in range(2):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            static_out = model(static_in)
    for step in range(args.steps):
        x, y = batch(step, shape)
        x, y = x.to(dev), y.to(dev)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        line = f"step {step} loss {loss.item():.9e}"
        if graph is not None:
            static_in.copy_(x)
            graph.replay()
            line += f" graph {static_out.double().sum().item():.9e}"
        print(line, flush=True)
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
    torch.cuda.synchronize()
    print(f"weights {weights_digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
