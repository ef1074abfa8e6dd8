"""ONNX export: `burn_remote.onnx.export(model, example, path)`.

Needs the `onnx` package (the `onnx` extra); onnxruntime is only needed to run the result.
"""

from ._export import MAX_INLINE_BYTES, MIN_OPSET, export, save, to_onnx
from ._lowering import LOWERINGS, NOT_EXPORTABLE
from ._trace import ExportError

__all__ = [
    "LOWERINGS",
    "MAX_INLINE_BYTES",
    "MIN_OPSET",
    "NOT_EXPORTABLE",
    "ExportError",
    "export",
    "save",
    "to_onnx",
]
