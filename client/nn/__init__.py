"""Neural-network modules; `functional` holds the stateless forms."""

from .. import functional
from ._init import seed
from ._layers import Linear, ReLU
from ._module import Module, ModuleList, Sequential

__all__ = ["Linear", "Module", "ModuleList", "ReLU", "Sequential", "functional", "seed"]
