"""Optimizers: updates recorded as fused ops with the learning rate as a graph binding."""

from ._optimizers import SGD, Adam, AdamW, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]
