"""Models written only in Python, exported for tcap::load_program (test/export/load_program_test.cpp).

  zoo.py make DIR NAME       DIR/NAME.pt2 (torch.export.export, batch dim dynamic, + torch.export.save) and
                             DIR/NAME.train.pt: (inputs, targets, forward output, losses of
                             STEPS training steps, parameter names, final parameters,
                             buffer names, final buffers)
                             computed here from the exported weights.
  zoo.py check DIR NAME FILE the parameters C++ trained (FILE: (names, tensors)) loaded
                             into the Python model: they must be Python's final ones, and
                             the model runs with them.
"""
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
torch.manual_seed(0)
STEPS = 5


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(Block(8), Block(8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.layer1(F.relu(self.bn(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.out = nn.Linear(12, 3)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.out(h[:, -1])


def zoo(name):
    """(model, inputs, targets, loss function, optimizer factory, train mode); NAME_core is
    NAME's program in core ATen IR (run_decompositions())."""
    if name.endswith("_core"):
        return zoo(name[: -len("_core")])
    if name == "mlp":
        m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        return m, torch.randn(8, 6), torch.randn(8, 3), F.mse_loss, lambda p: torch.optim.Adam(p, 1e-2), True
    if name == "resnet":
        m = ResNet()
        with torch.no_grad():  # running statistics that are not the defaults
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm2d):
                    mod.running_mean.uniform_(-0.2, 0.2)
                    mod.running_var.uniform_(0.5, 1.5)
        # Fine-tuning with BatchNorm frozen (eval): the running statistics are weights.
        return m, torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 1, 4]), F.cross_entropy, \
            lambda p: torch.optim.SGD(p, 0.05, momentum=0.9), False
    if name == "resnet_train":
        # BatchNorm in training mode: batch statistics, and the running statistics (buffers)
        # updated by every forward.
        return ResNet(), torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 1, 4]), F.cross_entropy, \
            lambda p: torch.optim.SGD(p, 0.05, momentum=0.9), True
    if name == "encoder":
        # SGD: the key projection's bias has a zero gradient up to rounding (softmax ignores
        # a shift), which Adam would scale up to full steps of rounding noise.
        return Encoder(), torch.randn(2, 5, 16), torch.randn(2, 4), F.mse_loss, \
            lambda p: torch.optim.SGD(p, 0.05, momentum=0.9), True
    if name == "tagger":
        return Tagger(), torch.randint(0, 20, (3, 7)), torch.randn(3, 3), F.mse_loss, \
            lambda p: torch.optim.SGD(p, 0.1), True
    raise SystemExit(f"zoo.py: no model {name}")


def make(d, name):
    m, x, y, loss_fn, make_opt, train = zoo(name)
    m.train(train)
    # The batch dim dynamic, as a served model's is.
    ep = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=64)},))
    if name.endswith("_core"):
        ep = ep.run_decompositions()  # functional: BatchNorm's buffer updates become outputs
    torch.export.save(ep, f"{d}/{name}.pt2")
    with torch.no_grad():
        out = m(x)
    opt = make_opt(m.parameters())
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    names = [n for n, _ in m.named_parameters()]
    params = [p.detach().clone() for _, p in m.named_parameters()]
    buffer_names = [n for n, _ in m.named_buffers()]
    buffers = [b.detach().clone() for _, b in m.named_buffers()]
    torch.save((x, y, out, torch.tensor(losses, dtype=torch.float64), names, params, buffer_names, buffers),
               f"{d}/{name}.train.pt")


def check(d, name, path):
    _, _, _, _, names, params, _, _ = torch.load(f"{d}/{name}.train.pt", weights_only=True)
    got_names, got = torch.load(path, weights_only=False)  # written by the test, with a list of names
    m, x, _, _, _, train = zoo(name)
    state = dict(zip(got_names, got))
    missing = [n for n in names if n not in state]
    if missing:
        raise SystemExit(f"zoo.py: C++ saved no {missing}")
    m.load_state_dict(state, strict=False)
    for n, p in zip(names, params):
        if not torch.allclose(dict(m.named_parameters())[n], p, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"zoo.py: {n} trained in C++ differs from Python's by "
                             f"{(dict(m.named_parameters())[n] - p).abs().max().item()}")
    m.train(train)
    with torch.no_grad():
        m(x)
    print("zoo.py: C++'s weights are Python's")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)
