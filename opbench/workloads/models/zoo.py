"""The seeds' CNNs and graph network as plain PyTorch modules (random weights; no model hub, no torchvision):
each takes ``(tiny, batch, seq)`` and returns the module and its inputs. The tiny variants keep every kind of
layer at a few channels and a small image, for tests."""
from __future__ import annotations

from typing import Any


def vgg16(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """VGG-16 (Simonyan & Zisserman, configuration D): 13 3x3 convolutions in 5 stages, max pooling between,
    3 fully connected layers."""
    import torch

    widths, size, hidden = ((4, 8, 16, 16, 16), 32, 32) if tiny else ((64, 128, 256, 512, 512), 224, 4096)
    layers: list[Any] = []
    channels = 3
    for stage, width in enumerate(widths):
        for _ in range(2 if stage < 2 else 3):
            layers += [torch.nn.Conv2d(channels, width, 3, padding=1), torch.nn.ReLU()]
            channels = width
        layers.append(torch.nn.MaxPool2d(2))
    side = size // 32
    layers += [torch.nn.Flatten(), torch.nn.Linear(channels * side * side, hidden), torch.nn.ReLU(),
               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10 if tiny else 1000)]
    return torch.nn.Sequential(*layers), (torch.randn(batch, 3, size, size),)


def squeezenet11(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """SqueezeNet 1.1 (Iandola et al.): fire modules, a 1x1 squeeze feeding 1x1 and 3x3 expands that are
    concatenated, with max pooling between groups and a 1x1 convolution as the classifier."""
    import torch

    scale, size = (8, 32) if tiny else (1, 224)

    class Fire(torch.nn.Module):
        def __init__(self, channels: int, squeeze: int, expand: int) -> None:
            super().__init__()
            self.squeeze = torch.nn.Conv2d(channels, squeeze // scale, 1)
            self.expand1 = torch.nn.Conv2d(squeeze // scale, expand // scale, 1)
            self.expand3 = torch.nn.Conv2d(squeeze // scale, expand // scale, 3, padding=1)

        def forward(self, x: Any) -> Any:
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.expand1(x)), torch.relu(self.expand3(x))], 1)

    def fire(squeeze: int, expand: int) -> tuple[Fire, int]:
        return Fire(channels[0], squeeze, expand), 2 * expand // scale

    channels = [64 // scale]
    layers: list[Any] = [torch.nn.Conv2d(3, channels[0], 3, stride=2), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, ceil_mode=True)]
    for squeeze, expand, pool in ((16, 64, False), (16, 64, True), (32, 128, False), (32, 128, True), (48, 192, False),
                                  (48, 192, False), (64, 256, False), (64, 256, False)):
        module, channels[0] = fire(squeeze, expand)
        layers += [module, *([torch.nn.MaxPool2d(3, 2, ceil_mode=True)] if pool else [])]
    layers += [torch.nn.Conv2d(channels[0], 10 if tiny else 1000, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
               torch.nn.Flatten()]
    return torch.nn.Sequential(*layers), (torch.randn(batch, 3, size, size),)


def dcgan(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """DCGAN's generator (Radford et al.): a latent vector up to a 64x64 image through four strided transposed
    convolutions with batch norm and ReLU, and a tanh."""
    import torch

    latent, width = (16, 8) if tiny else (100, 64)
    layers: list[Any] = []
    channels = latent
    for i, out in enumerate((8 * width, 4 * width, 2 * width, width)):
        layers += [torch.nn.ConvTranspose2d(channels, out, 4, 1 if i == 0 else 2, 0 if i == 0 else 1, bias=False),
                   torch.nn.BatchNorm2d(out), torch.nn.ReLU()]
        channels = out
    layers += [torch.nn.ConvTranspose2d(channels, 3, 4, 2, 1, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch, latent, 1, 1),)


def gcn(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """A two-layer GCN (Kipf & Welling) on a synthetic graph the size of Cora (2,708 nodes, 1,433 features, 7
    classes; ``batch`` graphs of it), its normalised adjacency dense: A (X W) twice, ReLU between."""
    import torch

    nodes, features, hidden, classes = (64, 32, 16, 7) if tiny else (2708, 1433, 16, 7)
    generator = torch.Generator().manual_seed(0)
    adjacency = (torch.rand(nodes, nodes, generator=generator) < 4 / nodes).float()
    adjacency = ((adjacency + adjacency.T) > 0).float() + torch.eye(nodes)
    degree = adjacency.sum(1).rsqrt()
    normalised = degree[:, None] * adjacency * degree[None, :]

    class GCN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("adjacency", normalised)
            self.first = torch.nn.Linear(features, hidden, bias=False)
            self.second = torch.nn.Linear(hidden, classes, bias=False)

        def forward(self, x: Any) -> Any:
            h = torch.relu(torch.matmul(self.adjacency, self.first(x)))
            return torch.matmul(self.adjacency, self.second(h))

    return GCN(), (torch.randn(batch, nodes, features),)


ZOO: dict[str, Any] = {"vgg-16": vgg16, "squeezenet1.1": squeezenet11, "dcgan": dcgan, "gcn": gcn}
