"""A test module for architecture torch: two inputs of different datatypes
(a float image, integer tokens) and two outputs (float scores, the integer
index of the best one)."""

import torch
from torch import nn


class Mixed(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.conv = nn.Conv1d(2, width, 3)
        self.head = nn.Linear(width, 5)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))  # an integer buffer in the state_dict

    def forward(self, image: torch.Tensor, tokens: torch.Tensor):
        x = self.conv(image).mean(-1) + self.embed(tokens).mean(1)
        scores = self.head(torch.tanh(x))
        return scores, scores.argmax(-1, keepdim=True)


def build(config: dict) -> nn.Module:
    return Mixed(int(config["vocab"]), int(config["width"]))
