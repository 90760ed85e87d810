"""PyTorch's cost per training step on the GPU, for `nvproxy bench --suite torch` (run as a script, natively and
under `nvproxy run`): one JSON record per line, as the suite's other programs print.

- `torch first tensor`: from this script's start to `import torch; torch.zeros(1, device="cuda")` done (seconds),
  the start-up that loading PyTorch's device code into the proxy may cost;
- `torch resnet18 step`: a ResNet-18 (torchvision's layout, written out here) training step at batch 64 on
  224x224 synthetic images (ms);
- `torch transformer step`: a small transformer encoder (4 layers, width 256, 8 heads, sequence 128, batch 32)
  training step (ms).
Each step's time is the median over timed steps after warm-up, from CUDA events around the step.  --quick makes
every size tiny (a smoke run).  (No result check: cuDNN's fastest algorithms are not deterministic; the test
tests/test_frameworks.py compares deterministic training exactly.)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

T0 = time.perf_counter()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


def record(bench: str, param: int, unit: str, value: float) -> None:
    print(json.dumps({"bench": bench, "param": param, "unit": unit, "value": value}), flush=True)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


def resnet18(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


class Transformer(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def step_times(model: nn.Module, make_batch, loss_of, warm: int, timed: int) -> float:
    """The median ms per training step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(warm + timed):
        x, y = make_batch(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = loss_of(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        end.record()
        end.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    record("torch first tensor", 0, "s", time.perf_counter() - T0)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    warm, timed = (1, 2) if quick else (5, 20)
    batch, side = (4, 32) if quick else (64, 224)
    images = torch.randn(batch, 3, side, side, device=dev)
    labels = torch.randint(0, 1000, (batch,), device=dev)
    ms = step_times(resnet18().to(dev), lambda i: (images, labels), F.cross_entropy, warm, timed)
    record("torch resnet18 step", batch, "ms", ms)
    vocab, width, layers, seq, tb = (64, 32, 1, 16, 2) if quick else (1000, 256, 4, 128, 32)
    tokens = torch.randint(0, vocab, (tb, seq + 1), device=dev)

    def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, vocab), y.reshape(-1))

    ms = step_times(Transformer(vocab, width, layers).to(dev), lambda i: (tokens[:, :-1], tokens[:, 1:]),
                          lm_loss, warm, timed)
    record("torch transformer step", tb, "ms", ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
