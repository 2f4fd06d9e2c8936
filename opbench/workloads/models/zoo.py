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

    branches = _branches()

    def fire(squeeze: int, expand: int) -> tuple[Any, int]:
        s, e = squeeze // scale, expand // scale
        return torch.nn.Sequential(  # a 1x1 squeeze, then 1x1 and 3x3 expands concatenated
            torch.nn.Conv2d(channels[0], s, 1), torch.nn.ReLU(),
            branches(torch.nn.Sequential(torch.nn.Conv2d(s, e, 1), torch.nn.ReLU()),
                     torch.nn.Sequential(torch.nn.Conv2d(s, e, 3, padding=1), torch.nn.ReLU()))), 2 * e

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
    classes; ``batch`` graphs of it), its normalised adjacency dense: A (X W) twice, ReLU between. Its
    ``sparse_form()`` is the same model with the adjacency in CSR (``torch.sparse.mm``), as PyTorch users run it."""
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

        def sparse_form(self) -> torch.nn.Module:
            return SparseGCN(self)

    class SparseGCN(torch.nn.Module):
        def __init__(self, dense: GCN) -> None:
            super().__init__()
            self.adjacency, self.first, self.second = dense.adjacency.to_sparse_csr(), dense.first, dense.second

        def propagate(self, h: Any) -> Any:
            """A h for each graph of the batch: one sparse product over the graphs' features side by side."""
            graphs, width = h.shape[0], h.shape[2]
            side_by_side = h.transpose(0, 1).reshape(nodes, graphs * width)
            return torch.sparse.mm(self.adjacency, side_by_side).reshape(nodes, graphs, width).transpose(0, 1)

        def forward(self, x: Any) -> Any:
            return self.propagate(self.second(torch.relu(self.propagate(self.first(x)))))

    return GCN(), (torch.randn(batch, nodes, features),)


def resnet3d18(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """ResNet3D-18 (Hara et al.): ResNet-18's basic blocks with 3x3x3 convolutions over a 16-frame 112x112 clip
    (strided in time and space from the second stage on; tiny: its first two stages)."""
    import torch

    widths, frames, size = ((4, 8), 4, 16) if tiny else ((64, 128, 256, 512), 16, 112)

    class Block(torch.nn.Module):
        def __init__(self, channels: int, width: int, stride: int) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv3d(channels, width, 3, stride, 1, bias=False), torch.nn.BatchNorm3d(width), torch.nn.ReLU(),
                torch.nn.Conv3d(width, width, 3, 1, 1, bias=False), torch.nn.BatchNorm3d(width))
            self.shortcut = torch.nn.Identity() if stride == 1 and channels == width else torch.nn.Sequential(
                torch.nn.Conv3d(channels, width, 1, stride, bias=False), torch.nn.BatchNorm3d(width))

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.shortcut(x))

    layers: list[Any] = [torch.nn.Conv3d(3, widths[0], (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
                         torch.nn.BatchNorm3d(widths[0]), torch.nn.ReLU(), torch.nn.MaxPool3d(3, 2, 1)]
    channels = widths[0]
    for stage, width in enumerate(widths):
        layers += [Block(channels, width, 1 if stage == 0 else 2), Block(width, width, 1)]
        channels = width
    layers += [torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 10 if tiny else 400)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch, 3, frames, size, size),)


def yolov3_tiny(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """YOLOv3-tiny (Redmon & Farhadi): convolutions with batch norm and leaky ReLU, max pooling (the last at
    stride 1), and two detection heads, the second on the first's features upsampled and concatenated with an
    earlier layer's (80 classes, 3 anchors a cell)."""
    import torch

    scale, size = (8, 64) if tiny else (1, 416)
    outputs = 3 * (5 + (4 if tiny else 80))

    def conv(channels: int, width: int, kernel: int = 3) -> Any:
        return torch.nn.Sequential(torch.nn.Conv2d(channels, width, kernel, padding=kernel // 2, bias=False),
                                   torch.nn.BatchNorm2d(width), torch.nn.LeakyReLU(0.1))

    def c(width: int) -> int:
        return width // scale

    class YoloV3Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            widths = (16, 32, 64, 128, 256)
            layers: list[Any] = []
            channels = 3
            for width in widths:
                layers += [conv(channels, c(width)), torch.nn.MaxPool2d(2, 2)]
                channels = c(width)
            self.to_route = torch.nn.Sequential(*layers[:-1])  # up to the 256-wide layer (stride 16)
            self.deep = torch.nn.Sequential(
                torch.nn.MaxPool2d(2, 2), conv(c(256), c(512)), torch.nn.ZeroPad2d((0, 1, 0, 1)), torch.nn.MaxPool2d(2, 1),
                conv(c(512), c(1024)), conv(c(1024), c(256), 1))
            self.head1 = torch.nn.Sequential(conv(c(256), c(512)), torch.nn.Conv2d(c(512), outputs, 1))
            self.lateral = torch.nn.Sequential(conv(c(256), c(128), 1), torch.nn.Upsample(scale_factor=2, mode="nearest"))
            self.head2 = torch.nn.Sequential(conv(c(128) + c(256), c(256)), torch.nn.Conv2d(c(256), outputs, 1))

        def forward(self, x: Any) -> tuple[Any, Any]:
            route = self.to_route(x)
            deep = self.deep(route)
            return self.head1(deep), self.head2(torch.cat([self.lateral(deep), route], 1))

    return YoloV3Tiny().eval(), (torch.randn(batch, 3, size, size),)


def densenet121(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """DenseNet-121 (Huang et al.): four dense blocks of 6, 12, 24 and 16 layers (batch norm, ReLU, a 1x1 then a
    3x3 convolution, the output concatenated to the block's input), transitions that halve the width and the
    image between them (tiny: 2 layers a block)."""
    import torch

    blocks, growth, stem, size = ((2, 2, 2, 2), 4, 8, 32) if tiny else ((6, 12, 24, 16), 32, 64, 224)

    branches = _branches()

    def layer(channels: int) -> Any:  # the input beside what the layer adds to it
        return branches(torch.nn.Identity(), torch.nn.Sequential(
            torch.nn.BatchNorm2d(channels), torch.nn.ReLU(), torch.nn.Conv2d(channels, 4 * growth, 1, bias=False),
            torch.nn.BatchNorm2d(4 * growth), torch.nn.ReLU(), torch.nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)))

    layers: list[Any] = [torch.nn.Conv2d(3, stem, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(stem), torch.nn.ReLU(),
                         torch.nn.MaxPool2d(3, 2, 1)]
    channels = stem
    for i, count in enumerate(blocks):
        for _ in range(count):
            layers.append(layer(channels))
            channels += growth
        if i < len(blocks) - 1:
            layers += [torch.nn.BatchNorm2d(channels), torch.nn.ReLU(), torch.nn.Conv2d(channels, channels // 2, 1, bias=False),
                       torch.nn.AvgPool2d(2, 2)]
            channels //= 2
    layers += [torch.nn.BatchNorm2d(channels), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
               torch.nn.Linear(channels, 10 if tiny else 1000)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch, 3, size, size),)


def _branches() -> Any:
    """A module that runs its branches on one input and concatenates their outputs along the channels."""
    import torch

    class Branches(torch.nn.Module):
        def __init__(self, *branches: Any) -> None:
            super().__init__()
            self.branches = torch.nn.ModuleList(branches)

        def forward(self, x: Any) -> Any:
            return torch.cat([branch(x) for branch in self.branches], 1)

    return Branches


class _InceptionBlocks:
    """Inception-v3's blocks, built from ``conv(cin, cout, kernel, stride, padding)``."""

    def __init__(self, conv: Any) -> None:
        import torch

        self.conv, self.seq, self.avg_pool, self.cat = conv, torch.nn.Sequential, torch.nn.AvgPool2d, _branches()

    def pool_conv(self, cin: int, cout: int) -> Any:
        return self.seq(self.avg_pool(3, 1, 1), self.conv(cin, cout, 1))

    def a(self, cin: int, pool: int) -> Any:
        conv = self.conv
        return self.cat(conv(cin, 64, 1), self.seq(conv(cin, 48, 1), conv(48, 64, 5, padding=2)),
                        self.seq(conv(cin, 64, 1), conv(64, 96, 3, padding=1), conv(96, 96, 3, padding=1)),
                        self.pool_conv(cin, pool))

    def c(self, c7: int) -> Any:
        conv, row, col = self.conv, {"padding": (0, 3)}, {"padding": (3, 0)}
        return self.cat(conv(768, 192, 1),
                        self.seq(conv(768, c7, 1), conv(c7, c7, (1, 7), **row), conv(c7, 192, (7, 1), **col)),
                        self.seq(conv(768, c7, 1), conv(c7, c7, (7, 1), **col), conv(c7, c7, (1, 7), **row),
                                 conv(c7, c7, (7, 1), **col), conv(c7, 192, (1, 7), **row)),
                        self.pool_conv(768, 192))

    def split_3x3(self, cin: int) -> Any:
        return self.cat(self.conv(cin, 384, (1, 3), padding=(0, 1)), self.conv(cin, 384, (3, 1), padding=(1, 0)))

    def e(self, cin: int) -> Any:
        conv = self.conv
        return self.cat(conv(cin, 320, 1), self.seq(conv(cin, 384, 1), self.split_3x3(384)),
                        self.seq(conv(cin, 448, 1), conv(448, 384, 3, padding=1), self.split_3x3(384)),
                        self.pool_conv(cin, 192))

    def reductions(self, pool: Any) -> tuple[Any, Any]:
        """The two grid reductions, 35 to 17 (288 channels to 768) and 17 to 8 (768 to 1280)."""
        conv = self.conv
        return (self.cat(conv(288, 384, 3, 2), self.seq(conv(288, 64, 1), conv(64, 96, 3, padding=1), conv(96, 96, 3, 2)),
                         pool(3, 2)),
                self.cat(self.seq(conv(768, 192, 1), conv(192, 320, 3, 2)),
                         self.seq(conv(768, 192, 1), conv(192, 192, (1, 7), padding=(0, 3)),
                                  conv(192, 192, (7, 1), padding=(3, 0)), conv(192, 192, 3, 2)),
                         pool(3, 2)))


def inception_v3(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    """Inception-v3 (Szegedy et al., as torchvision builds it, without the auxiliary head): a stem of 3x3
    convolutions, then 3 blocks A (1x1, 5x5 and double 3x3 branches beside an average pool), a grid reduction,
    4 blocks C (7x7 factorised into 1x7 and 7x1), a reduction, 2 blocks E (3x3 split into 1x3 and 3x1), each
    block's branches concatenated (tiny: one block of each, an eighth of the widths, a 75x75 image)."""
    import torch

    div, size, repeats = (8, 75, (1, 1)) if tiny else (1, 299, (4, 2))

    def w(width: int) -> int:  # every width is a multiple of 8; the image's 3 channels stay
        return width if width == 3 else width // div

    def conv(cin: int, cout: int, kernel: Any, stride: int = 1, padding: Any = 0) -> Any:
        return torch.nn.Sequential(torch.nn.Conv2d(w(cin), w(cout), kernel, stride, padding, bias=False),
                                   torch.nn.BatchNorm2d(w(cout), eps=0.001), torch.nn.ReLU())

    blocks = _InceptionBlocks(conv)
    to_17, to_8 = blocks.reductions(torch.nn.MaxPool2d)
    a_in = [(192, 64)] if tiny else [(192, 32), (256, 64), (288, 64)]  # either way 288 channels out
    layers = [conv(3, 32, 3, 2), conv(32, 32, 3), conv(32, 64, 3, padding=1), torch.nn.MaxPool2d(3, 2),
              conv(64, 80, 1), conv(80, 192, 3), torch.nn.MaxPool2d(3, 2),
              *(blocks.a(cin, pool) for cin, pool in a_in), to_17,
              *(blocks.c(c7) for c7 in (128, 160, 160, 192)[:repeats[0]]), to_8,
              *(blocks.e(cin) for cin in (1280, 2048)[:repeats[1]]),
              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(w(2048), 10 if tiny else 1000)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch, 3, size, size),)


ZOO: dict[str, Any] = {"vgg-16": vgg16, "squeezenet1.1": squeezenet11, "dcgan": dcgan, "gcn": gcn,
                       "resnet3d-18": resnet3d18, "yolov3-tiny": yolov3_tiny, "densenet-121": densenet121,
                       "inception-v3": inception_v3}
