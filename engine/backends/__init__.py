"""Backends by device string; each module registers kernels by op name."""
