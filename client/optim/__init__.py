"""Optimizers: fused updates, parameter groups, LR schedules carried as graph bindings."""

from . import lr_scheduler
from ._clip import clip_grad_norm
from ._groups import ParamGroup
from ._optimizer import Group, Optimizer
from ._optimizers import SGD, Adadelta, Adam, AdamW
from ._schedule import WarmupCosine, constant, cosine, linear_warmup

__all__ = [
    "SGD",
    "Adadelta",
    "Adam",
    "AdamW",
    "Group",
    "Optimizer",
    "ParamGroup",
    "WarmupCosine",
    "clip_grad_norm",
    "constant",
    "cosine",
    "linear_warmup",
    "lr_scheduler",
]
