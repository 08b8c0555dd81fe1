"""A small convolutional network on the 8x8 UCI optical digits: stepserve's
example of an `architecture: torch` model. stepserve imports this file and
calls build(config) for the module; forward takes the inputs model.yaml
declares, in order, batched, and returns the outputs in order."""

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 16, hidden), nn.ReLU(), nn.Linear(hidden, 10),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        # Pixels are 0..16 in the data: scaled here, so clients send them as
        # they are.
        logits = self.head(self.features(image / 16))
        return torch.softmax(logits, dim=-1)


def build(config: dict) -> nn.Module:
    return DigitsCNN(channels=int(config.get("channels", 16)), hidden=int(config.get("hidden", 64)))
