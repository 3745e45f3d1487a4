"""The CIFAR ResNet of He et al. (2016): 6n+2 layers, widths w, 2w, 4w, option-B shortcuts."""

from __future__ import annotations

from torch import Tensor, nn

from .registry import register_model


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs."""

    def __init__(self, depth: int = 20, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True))
        layers, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            blocks = []
            for b in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if (b == 0 and stage > 0) else 1))
                cin = cout
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(self.pool(x).flatten(1))


@register_model("cifar_resnet20", input_shape=(1, 3, 32, 32))
def cifar_resnet20(num_classes: int = 10, width: int = 16) -> CifarResNet:
    return CifarResNet(20, width, num_classes)


@register_model("cifar_resnet8", input_shape=(1, 3, 32, 32))
def cifar_resnet8(num_classes: int = 10, width: int = 16) -> CifarResNet:
    """A tiny member of the family, for tests and the embedded demo."""
    return CifarResNet(8, width, num_classes)
