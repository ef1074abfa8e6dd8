"""ONNX export: `burn_remote.onnx.export(model, example, path)`.

    from burn_remote import onnx as bonnx
    bonnx.export(model, x_batch, "model.onnx", input_names=["x"], output_names=["logits"])

The model is traced on its device without running (the recorder holds its ops), in eval
mode with LoRA merged; each primitive op is lowered through one table (`LOWERINGS`, keyed by
registry names; `NOT_EXPORTABLE` says why the others are not). Axis 0 of every input is a
symbolic "batch" by default; `dynamic_axes={"ids": {0: "batch", 1: "sequence"}}` names any
others. Sizes that follow them (B, T, B * T...) are found by tracing at a few sizes and become
Shape-based computations (see `_trace`). Weights above 2 GiB go to external data.

`export_decoder(model, path)` writes a causal LM as optimum exports decoders: past_key_values
in, present out, so onnxruntime can run the generation loop (see `_decoder`).

Needs the `onnx` package (the `onnx` extra); onnxruntime is only needed to run the result.
"""

try:
    from ._decoder import export_decoder
    from ._export import MAX_INLINE_BYTES, MIN_OPSET, export, save, to_onnx
    from ._lowering import LOWERINGS, NOT_EXPORTABLE
    from ._trace import ExportError
except ModuleNotFoundError as exc:  # the extra is not installed: say how to install it
    if exc.name != "onnx":
        raise
    raise ModuleNotFoundError(
        "burn_remote.onnx needs the onnx package, which a plain install leaves out: "
        "pip install 'burn-remote[onnx]' (onnx, and onnxruntime to run the file)",
        name="onnx",
    ) from None

__all__ = [
    "LOWERINGS",
    "MAX_INLINE_BYTES",
    "MIN_OPSET",
    "NOT_EXPORTABLE",
    "ExportError",
    "export",
    "export_decoder",
    "save",
    "to_onnx",
]
