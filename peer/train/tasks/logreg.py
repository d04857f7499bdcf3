"""Logistic regression on numpy-generated data of any size: convex, for checks against theory.

Data: ``x ~ N(0, I_d)``; true weights ``W ~ N(0, 4/d)`` per class, so logits have a
standard deviation of about 2; each label is *sampled* from the softmax of its
logits (label noise keeps the problem non-separable: the optimum is finite and unique
up to softmax's shift). Everything comes from ``data_seed``.

Model: ``nn.Linear(n_features, n_classes)`` (one logit when ``binary``), initialised to
zero; loss: mean cross-entropy (binary: mean logistic loss on a single logit).
The reference optimum of the full training loss is computed once, in float64, with
L-BFGS to a gradient norm of 1e-11.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from peer.train.tasks.base import Task, TaskError, cross_entropy, seeded
from protocols.rng import numpy_generator

BAR_GAP = 1e-3  # "within 1e-3 of the optimum's loss" (full training loss)


def binary_logistic(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean logistic loss of one logit per sample against 0/1 labels."""
    logits = output.reshape(target.shape)
    return nn.functional.binary_cross_entropy_with_logits(logits, target.to(output.dtype))


@functools.cache
def generate(n_samples: int, n_features: int, n_classes: int, test_samples: int,
             data_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x float64, train_y int64, test_x, test_y), cached per process."""
    rng = numpy_generator(data_seed, "", 0, "logreg-data")
    weights = rng.normal(0.0, 2.0 / np.sqrt(n_features), size=(n_features, n_classes))
    total = n_samples + test_samples
    x = rng.normal(size=(total, n_features))
    logits = x @ weights
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    uniform = rng.random(total)
    y = (probs.cumsum(axis=1) < uniform[:, None]).sum(axis=1).clip(max=n_classes - 1).astype(np.int64)
    return x[:n_samples], y[:n_samples], x[n_samples:], y[n_samples:]


def full_loss_and_grad(theta: np.ndarray, x: np.ndarray, y: np.ndarray, n_classes: int,
                       binary: bool) -> tuple[float, np.ndarray]:
    """Mean loss and gradient at flat ``theta`` laid out as the model's flat_params (weight, then bias)."""
    n, d = x.shape
    outputs = 1 if binary else n_classes
    weight = theta[:outputs * d].reshape(outputs, d)
    bias = theta[outputs * d:]
    logits = x @ weight.T + bias
    if binary:
        z = logits[:, 0]
        loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
        residual = (1.0 / (1.0 + np.exp(-z)) - y)[:, None] / n
    else:
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        loss = float(np.mean(log_norm - shifted[np.arange(n), y]))
        residual = np.exp(shifted - log_norm[:, None])
        residual[np.arange(n), y] -= 1.0
        residual /= n
    grad = np.concatenate([(residual.T @ x).ravel(), residual.sum(axis=0)])
    return loss, grad


def optimum_loss(x: np.ndarray, y: np.ndarray, n_classes: int, binary: bool) -> float:
    """The minimum of the mean training loss, by float64 L-BFGS."""
    from scipy.optimize import minimize

    outputs = 1 if binary else n_classes
    theta0 = np.zeros(outputs * (x.shape[1] + 1))
    result = minimize(full_loss_and_grad, theta0, args=(x, y, n_classes, binary), jac=True,
                      method="L-BFGS-B", options={"maxiter": 20000, "gtol": 1e-11, "ftol": 0.0})
    return float(result.fun)


def logreg(*, n_samples: int = 2000, n_features: int = 20, n_classes: int = 2, binary: bool = False,
           test_samples: int | None = None, data_seed: int = 0) -> Task:
    """A logistic-regression task; bar: full training loss within 1e-3 of the optimum."""
    if n_samples < 1 or n_features < 1:
        raise TaskError("logreg: n_samples and n_features must be at least 1")
    if n_classes < 2:
        raise TaskError("logreg: n_classes must be at least 2")
    if binary and n_classes != 2:
        raise TaskError("logreg: binary=true needs n_classes = 2")
    n_test = max(1, n_samples // 4) if test_samples is None else test_samples
    if n_test < 1:
        raise TaskError("logreg: test_samples must be at least 1")
    train_x, train_y, test_x, test_y = generate(n_samples, n_features, n_classes, n_test, data_seed)
    outputs = 1 if binary else n_classes

    def build(seed: int) -> nn.Module:
        # Zero start: convex, so the seed does not matter, and a numpy recursion starts from 0 too.
        with seeded(seed):  # keeps nn.Linear's throwaway init off the global generator
            model = nn.Linear(n_features, outputs)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
        return model

    @functools.cache
    def reference() -> float:
        return optimum_loss(train_x, train_y, n_classes, binary)

    return Task(
        name="logreg", build_model=build,
        train_x=torch.from_numpy(train_x), train_y=torch.from_numpy(train_y),
        test_x=torch.from_numpy(test_x), test_y=torch.from_numpy(test_y),
        loss_fn=binary_logistic if binary else cross_entropy,
        bar={"optimality_gap": BAR_GAP}, reference_loss=reference,
        info={"n_classes": n_classes, "binary": binary, "n_features": n_features},
    )
