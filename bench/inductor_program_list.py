"""The programs of test/programs/*.h written again in Python for tcap-bench's
torch.compile peer (inductor_programs.py runs them): same layers and sizes, losses,
optimizers and hyper-parameters, schedule, clipping, hooks and batch shapes."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from inductor_programs import Program, program_workload, step_generator
from peer_common import CppEncoderLayer

class CnnNet(nn.Module):
    """cnn::NetImpl."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.bn2 = nn.BatchNorm2d(16)
        self.dropout = nn.Dropout(0.0)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 16 -> 14 -> 7
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 7 -> 5 -> 2
        x = x.view(-1, 64)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        return F.log_softmax(self.fc2(x), dim=1)


class Cnn(Program):
    """cnn::Cnn: SGD with momentum, nll_loss, batch `batch` of 1x16x16."""

    def __init__(self, compiled, batch=8):
        super().__init__(11, compiled)
        self.batch_size = batch
        self.model = CnnNet()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(11, step)
        return [torch.randn(self.batch_size, 1, 16, 16, generator=gen),
                torch.randint(0, 10, (self.batch_size,), generator=gen)]

    def train_step(self, batch):
        self.opt.zero_grad()
        output = self.forward(batch[0])
        loss = F.nll_loss(output, batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


GAN_NOISE = 8  # gan::kNoise


class GanGenerator(nn.Module):
    """gan::GeneratorImpl."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(GAN_NOISE, 16, 4, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))  # 1 -> 4
        x = F.relu(self.bn2(self.conv2(x)))  # 4 -> 8
        return torch.tanh(self.conv3(x))  # 8 -> 16


def gan_discriminator():
    """gan::discriminator()."""
    return nn.Sequential(nn.Conv2d(1, 8, 4, stride=2, padding=1, bias=False),  # 16 -> 8
                         nn.LeakyReLU(0.2),
                         nn.Conv2d(8, 16, 4, stride=2, padding=1, bias=False),  # 8 -> 4
                         nn.BatchNorm2d(16), nn.LeakyReLU(0.2),
                         nn.Conv2d(16, 1, 4, bias=False),  # 4 -> 1
                         nn.Flatten())


class Gan(Program):
    """gan::Gan: two Adams (betas 0.5, 0.999), D on real and fake.detach(), then G through
    D, in one step."""

    def __init__(self, compiled):
        super().__init__(12, compiled)
        self.generator = GanGenerator()
        self.discriminator = gan_discriminator()
        self.g_opt = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.g = self.compile(self.generator)
        self.d = self.compile(self.discriminator)

    def modules(self):
        return [self.generator, self.discriminator]

    def batch(self, step):
        gen = step_generator(12, step)
        return [torch.rand(8, 1, 16, 16, generator=gen) * 2 - 1, torch.randn(8, GAN_NOISE, 1, 1, generator=gen)]

    def train_step(self, batch):
        real, noise = batch
        n = real.size(0)
        # Train the discriminator on real images and detached fakes.
        self.d_opt.zero_grad()
        real_labels = torch.full((n, 1), 0.9)  # label smoothing, as the example does
        d_loss_real = F.binary_cross_entropy_with_logits(self.d(real), real_labels)
        fake = self.g(noise)
        fake_labels = torch.zeros(n, 1)
        d_loss_fake = F.binary_cross_entropy_with_logits(self.d(fake.detach()), fake_labels)
        d_loss = d_loss_real + d_loss_fake
        d_loss.backward()
        self.d_opt.step()
        # Train the generator through the discriminator.
        self.g_opt.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(self.d(fake), torch.ones(n, 1))
        g_loss.backward()
        self.g_opt.step()
        return [d_loss, g_loss]


LSTM_VOCAB, LSTM_EMBED, LSTM_HIDDEN, LSTM_SEQ, LSTM_BATCH = 40, 12, 16, 10, 3  # lstm::k*


class LstmLm(nn.Module):
    """lstm::LstmLmImpl. nn::LSTM and nn.LSTM agree: sequence first (batch_first false),
    biases, no dropout, the hidden state starting at zero."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(LSTM_VOCAB, LSTM_EMBED)
        self.lstm = nn.LSTM(LSTM_EMBED, LSTM_HIDDEN, num_layers=2)
        self.decoder = nn.Linear(LSTM_HIDDEN, LSTM_VOCAB)

    def forward(self, ids):  # ids: [seq, batch]; returns [seq, batch, vocab] logits
        output = self.lstm(self.encoder(ids))[0]
        return self.decoder(output)


class LanguageModelProgram(Program):
    """A next-token language model's step, as the C++ LM programs write it: random token
    streams of [seq + 1, batch] from the program's seed, cross_entropy of every position's
    logits against the next token, one optimizer. Subclasses give shape() = (vocab, seq,
    batch), the model (self.forward) and the optimizer (self.opt)."""

    def batch(self, step):
        vocab, seq, batch = self.shape()
        text = torch.randint(0, vocab, (seq + 1, batch), generator=step_generator(self.seed, step))
        return [text[:seq].contiguous(), text[1:].contiguous()]

    def train_step(self, batch):
        vocab = self.shape()[0]
        self.opt.zero_grad()
        logits = self.forward(batch[0])
        loss = F.cross_entropy(logits.view(-1, vocab), batch[1].view(-1))
        loss.backward()
        self.opt.step()
        return [loss]


class LstmProgram(LanguageModelProgram):
    """lstm::LstmProgram: Adam, cross_entropy over the next token, [10, 3] tokens."""

    def __init__(self, compiled):
        super().__init__(14, compiled)
        self.model = LstmLm()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.forward = self.compile(self.model)

    def shape(self):
        return LSTM_VOCAB, LSTM_SEQ, LSTM_BATCH


class TutorialMlp(Program):
    """tutorials::TutorialMlp: Linear(10, 5), ReLU, Linear(5, 2), Softmax; mse_loss against
    a softmax target; the optimizer, batch and seed are parameters (mlp_small_step is the
    same program with Adam at batch 1: overhead::mlp_small_adam)."""

    def __init__(self, compiled, seed=16, batch=9, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)):
        super().__init__(seed, compiled)
        self.seed = seed
        self.batch_size = batch
        self.model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 2), nn.Softmax(1))
        self.opt = make_optimizer(self.model.parameters())
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(self.seed, step)
        return [torch.randn(self.batch_size, 10, generator=gen),
                torch.softmax(torch.randn(self.batch_size, 2, generator=gen), 1)]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


class ManyParams(nn.Module):
    """overhead::ManyParamsImpl: 100 parameters of small odd shapes, flattened,
    concatenated and multiplied by the batch."""

    PARAMS = 100

    def __init__(self):
        super().__init__()
        self.names = []
        for i in range(self.PARAMS):
            a, b = 1 + i % 7, 1 + (i * 3) % 5
            self.register_parameter(f"p{i}", nn.Parameter(torch.randn(a) if i % 3 == 0 else torch.randn(a, b)))
            self.names.append(f"p{i}")

    def numel(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, w):
        return torch.cat([getattr(self, n).reshape(-1) for n in self.names]) * w


class Adam100(Program):
    """overhead::Adam100: loss sum((cat(params) * w)^2), Adam."""

    def __init__(self, compiled):
        super().__init__(29, compiled)
        self.model = ManyParams()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [torch.rand(self.model.numel(), generator=step_generator(29, step)) + 0.5]

    def train_step(self, batch):
        self.opt.zero_grad()
        out = self.forward(batch[0])
        loss = (out * out).sum()
        loss.backward()
        self.opt.step()
        return [loss]


REGRESSION_BASE_LR = 0.05  # regression::kBaseLr


class RegressionMlp(Program):
    """regression::RegressionMlp: SGD with momentum under a warm-up then exponential-decay
    schedule set before every step, clip_grad_norm_ between backward and step; with
    log_norm the norm it returns is read on the host (.item(), as LibTorch's
    clip_grad_norm_ returns a double) and logged."""

    def __init__(self, compiled, log_norm):
        super().__init__(15, compiled)
        self.log_norm = log_norm
        self.model = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=REGRESSION_BASE_LR, momentum=0.9)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(15, step)
        x = torch.randn(24, 7, generator=gen)
        y = (x.narrow(1, 0, 1) * 2 - x.narrow(1, 3, 1)).sin() + 0.1 * torch.randn(24, 1, generator=gen)
        return [x, y]

    def before_step(self, step):
        lr = REGRESSION_BASE_LR * (step + 1) / 5 if step < 5 else REGRESSION_BASE_LR * 0.9 ** (step - 5)
        for group in self.opt.param_groups:
            group["lr"] = lr

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=0.5).item()
        if self.log_norm:
            self.host_log.append(norm)
        self.opt.step()
        return [loss]


GCN_NODES, GCN_FEATURES, GCN_HIDDEN, GCN_CLASSES = 67, 12, 16, 4  # gcn::k*


class Gcn(nn.Module):
    """gcn::GcnImpl: two graph convolutions over a fixed normalized adjacency (a buffer)."""

    def __init__(self, adj):
        super().__init__()
        self.register_buffer("adj", adj)
        self.l1 = nn.Linear(GCN_FEATURES, GCN_HIDDEN)
        self.l2 = nn.Linear(GCN_HIDDEN, GCN_CLASSES)

    def forward(self, x):
        h = torch.relu(torch.mm(self.adj, self.l1(x)))
        return torch.mm(self.adj, self.l2(h))


class GcnProgram(Program):
    """gcn::GcnProgram: full-batch node classification on one random graph, cross_entropy
    over the nodes a boolean train mask selects, Adam."""

    def __init__(self, compiled):
        super().__init__(31, compiled)
        gen = torch.Generator().manual_seed(31)  # gcn::Graph
        self.x = torch.randn(GCN_NODES, GCN_FEATURES, generator=gen)
        a = (torch.rand(GCN_NODES, GCN_NODES, generator=gen) < 0.08).float().triu(1)
        a = a + a.t() + torch.eye(GCN_NODES)
        d = a.sum(1).pow(-0.5)
        adj = d.unsqueeze(1) * a * d.unsqueeze(0)
        self.y = torch.randint(GCN_CLASSES, (GCN_NODES,), generator=gen)
        self.train_mask = torch.rand(GCN_NODES, generator=gen) < 0.4
        self.model = Gcn(adj)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [self.x, self.y, self.train_mask]

    def train_step(self, batch):
        self.opt.zero_grad()
        out = self.forward(batch[0])
        loss = F.cross_entropy(out[batch[2]], batch[1][batch[2]])
        loss.backward()
        self.opt.step()
        return [loss]


UNET_BATCH, UNET_IMAGE, UNET_CHANNELS = 4, 24, 3  # unet::k*


class UNetBlock(nn.Module):
    """unet::BlockImpl: (Conv2d 3x3, GroupNorm, SiLU) x 2 and a 1x1 skip convolution."""

    def __init__(self, cin, cout, groups):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n1 = nn.GroupNorm(groups, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.n2 = nn.GroupNorm(groups, cout)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = F.silu(self.n1(self.c1(x)))
        h = F.silu(self.n2(self.c2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """unet::UNetImpl (modules registered in the same order)."""

    def __init__(self):
        super().__init__()
        self.enc1 = UNetBlock(UNET_CHANNELS, 16, 4)
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.enc2 = UNetBlock(16, 32, 8)
        self.dec1 = UNetBlock(48, 16, 4)
        self.out = nn.Conv2d(16, UNET_CHANNELS, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.down(e1))
        up = F.interpolate(e2, scale_factor=(2.0, 2.0), mode="nearest")
        return self.out(self.dec1(torch.cat([up, e1], 1)))


class UNetProgram(Program):
    """unet::UNetProgram: a denoiser, mse_loss(out, clean) for a noisy input, AdamW."""

    def __init__(self, compiled):
        super().__init__(41, compiled)
        self.model = UNet()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(41, step)
        shape = (UNET_BATCH, UNET_CHANNELS, UNET_IMAGE, UNET_IMAGE)
        clean = torch.randn(*shape, generator=gen)
        return [clean + 0.3 * torch.randn(*shape, generator=gen), clean]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


TF_VOCAB, TF_MODEL, TF_CONTEXT, TF_BATCH = 32, 16, 12, 4  # transformer::k*


class TransformerLm(nn.Module):
    """transformer::TransformerLmImpl: token and positional Embeddings, two LibTorch
    TransformerEncoderLayer (TransformerEncoderLayerOptions(16, 4).dim_feedforward(32)
    .dropout(0): post-norm, ReLU, sequence first, attention with need_weights=true: see
    CppEncoderLayer) under a causal float mask, a Linear head."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(TF_VOCAB, TF_MODEL)
        self.positions = nn.Embedding(TF_CONTEXT, TF_MODEL)
        self.layer1 = CppEncoderLayer(TF_MODEL, 4, 2 * TF_MODEL)
        self.layer2 = CppEncoderLayer(TF_MODEL, 4, 2 * TF_MODEL)
        self.head = nn.Linear(TF_MODEL, TF_VOCAB)

    def forward(self, ids):  # ids: [seq, batch] token ids; returns [seq, batch, vocab] logits
        seq = ids.size(0)
        pos = torch.arange(seq, dtype=ids.dtype, device=ids.device)
        x = self.tokens(ids) + self.positions(pos).unsqueeze(1)
        causal = torch.triu(torch.full((seq, seq), float("-inf")), 1)
        x = self.layer1(x, causal)
        x = self.layer2(x, causal)
        return self.head(x)


class TransformerProgram(LanguageModelProgram):
    """transformer::TransformerProgram: AdamW (lr 1e-3, weight_decay 0.01); a hook on every
    parameter logs its gradient's norm on the host (g.norm().item())."""

    def __init__(self, compiled):
        super().__init__(13, compiled)
        self.model = TransformerLm()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.forward = self.compile(self.model)
        for p in self.model.parameters():
            p.register_hook(lambda g: self.host_log.append(g.norm().item()))

    def shape(self):
        return TF_VOCAB, TF_CONTEXT, TF_BATCH

    def comparable(self, name, param):
        # The key bias of attention has a zero true gradient: its (AdamW-normalised)
        # rounding noise is left out, as the C++ program does.
        if "in_proj_bias" not in name:
            return param
        return torch.cat([param[:TF_MODEL], param[2 * TF_MODEL:]])


class CosCosModel(nn.Module):
    """tutorials::CosCosImpl."""

    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(7, 5))
        self.c = nn.Parameter(torch.randn(5))
        self.d = nn.Parameter(torch.randn(7, 1))

    def forward(self, a):
        return torch.cos(torch.cos(a + self.b + self.c + self.d))


class TutorialCosCos(Program):
    """tutorials::TutorialCosCos: b, c, d parameters, a the batch, the sum as loss, SGD
    with momentum."""

    def __init__(self, compiled):
        super().__init__(17, compiled)
        self.model = CosCosModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [torch.randn(7, 5, generator=step_generator(17, step))]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = self.forward(batch[0]).sum()
        loss.backward()
        self.opt.step()
        return [loss]


PROGRAMS = {
    "program_cnn": program_workload(lambda c: Cnn(c)),
    "cnn_step": program_workload(lambda c: Cnn(c, 16)),
    "mlp_small_step": program_workload(lambda c: TutorialMlp(c, 23, 1, lambda ps: torch.optim.Adam(ps, lr=1e-2))),
    "adam100": program_workload(lambda c: Adam100(c)),
    "program_dcgan": program_workload(lambda c: Gan(c)),
    "program_transformer": program_workload(lambda c: TransformerProgram(c)),
    "program_lstm": program_workload(lambda c: LstmProgram(c)),
    "program_regression": program_workload(lambda c: RegressionMlp(c, log_norm=True)),
    "program_gcn": program_workload(lambda c: GcnProgram(c)),
    "program_unet": program_workload(lambda c: UNetProgram(c)),
    "program_tutorial_mlp": program_workload(lambda c: TutorialMlp(c)),
    "program_coscos": program_workload(lambda c: TutorialCosCos(c)),
}
