"""Cells of notebooks/deep_learning_in_miniature.ipynb (see ../_build_notebooks.py)."""

CELLS = [
    (
        "md",
        """# Tilted losses for neural networks, in miniature

Most users of tilted losses train networks on minibatches. `tiltlab.torch.TiltedLoss`
wraps a per-sample criterion and keeps a running estimate of the normaliser of the whole
data (the paper's Algorithm 2), so the gradient of each batch estimates the gradient of
the tilted risk of the data rather than of the batch. This notebook runs the paper's three
deep experiments at a scale that fits a laptop CPU: scikit-learn's handwritten digits
(8 x 8 images), a small MLP, Adam, one seed. The commands `tiltlab reproduce label-noise`,
`noisy-annotators` and `class-imbalance` run them with more seeds (`--device cuda` on a
GPU; `label-noise --data-dir DIR` on the real CIFAR-10 batches).""",
    ),
    (
        "md",
        """## A training loop with `TiltedLoss`

The tilt can follow a schedule, a callable of the step. With noisy labels the paper ramps
it from 0 to -2 over training: a network that has learnt nothing yet has high losses
everywhere, and a strongly negative tilt from the first step would single out whatever it
happens to fit first.""",
    ),
    (
        "code",
        """import numpy as np
import torch

from tiltlab.minibatch import linear_schedule
from tiltlab.reproduce import deep
from tiltlab.torch import TiltedLoss

torch.manual_seed(0)
split = deep.digits_split(0)
rng = np.random.default_rng(0)
noisy, replaced = deep.uniform_label_noise(split.y_train, 0.8, 10, rng)
X, y = torch.as_tensor(split.X_train), torch.as_tensor(noisy)

epochs, batch = 80, 64
steps = epochs * -(-len(y) // batch)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10))
loss_fn = TiltedLoss(torch.nn.CrossEntropyLoss(reduction="none"),
                     t=linear_schedule(0.0, -2.0, steps))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(epochs):
    for idx in torch.randperm(len(y)).split(batch):
        loss = loss_fn(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()

print(f"80% of the training labels replaced at random: clean test accuracy "
      f"{deep.accuracy(model, split.X_test, split.y_test):.3f}")""",
    ),
    (
        "md",
        """## Label noise

ERM, three robust losses, TERM with the ramped tilt, and Genie ERM (trained on the rows
whose labels were not replaced). The brackets hold the paper's CIFAR-10 numbers, for the
direction of the effect only: the data and the network differ.""",
    ),
    (
        "code",
        """import tempfile

from IPython.display import Image, display

from tiltlab.reproduce import class_imbalance, label_noise, noisy_annotators

figures = tempfile.mkdtemp()
rep = label_noise(seeds=1, quick=True)
print(rep.report())
for path in rep.plot(figures):
    display(Image(path))""",
    ),
    (
        "md",
        """## Low-quality annotators

100 annotators, most of whom label at random; each training row is labelled by one of
them. TERM tilts at the annotator level (t = -2) and so down-weights the annotators whose
running risk is high; Genie ERM trains on the reliable annotators' rows only.""",
    ),
    (
        "code",
        """rep = noisy_annotators(seeds=1, quick=True)
print(rep.report())
for path in rep.plot(figures):
    display(Image(path))""",
    ),
    (
        "md",
        """## Class imbalance

4s against 9s with the 4s rare in training; the test split is balanced. Class-level TERM
(t = 20 across the running class risks) needs no class counts; class-balanced weighting
does.""",
    ),
    (
        "code",
        """rep = class_imbalance(seeds=1, quick=True)
print(rep.report())
for path in rep.plot(figures):
    display(Image(path))""",
    ),
]
