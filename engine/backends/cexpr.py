"""One table of C expressions for the elementwise ops, shared by every generated-kernel target.

The OpenCL backend builds its elementwise kernels from this table and the CuPy backend builds
its fused `ElementwiseKernel`s from it, so an op's device semantics are written once. The
expressions are plain C that OpenCL C and CUDA C both accept: `{a}`, `{b}`, `{c}` are the
operands already converted to the op's compute type, `{T}` names that compute type. An entry
is either one expression or a dict by the compute type's kind ("f" float, "i" integer/bool).

Semantics follow the NumPy kernels (numpy_kernels.py): integer `div` floors and gives 0 on a
zero divisor, `maximum`/`minimum` propagate NaN, `sigmoid`/`softplus` use the stable branches.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...protocol import dtypes

UNARY: dict[str, str | Mapping[str, str]] = {
    "neg": "(-{a})",
    "abs": {"f": "fabs({a})", "i": "({a} < 0 ? ({T})(-{a}) : {a})"},
    "sign": "(({T})(({a} > 0) - ({a} < 0)))",
    "exp": "exp({a})",
    "log": "log({a})",
    "sqrt": "sqrt({a})",
    "rsqrt": "(({T})1 / sqrt({a}))",
    "sin": "sin({a})",
    "cos": "cos({a})",
    "tanh": "tanh({a})",
    "floor": {"f": "floor({a})", "i": "{a}"},
    "erf": "erf({a})",
    "sigmoid": "({a} >= 0 ? ({T})1 / (({T})1 + exp(-{a})) : exp({a}) / (({T})1 + exp({a})))",
    "relu": "({a} < 0 ? ({T})0 : {a})",
    "softplus": "(({a} > 0 ? {a} : ({T})0) + log1p(exp(-fabs({a}))))",
    "logical_not": "(!{a})",
}

BINARY: dict[str, str | Mapping[str, str]] = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "div": {
        "f": "({a} / {b})",
        "i": "({b} == 0 ? ({T})0 : ({T})({a} / {b} - (({a} % {b} != 0) && (({a} < 0) != ({b} < 0)))))",
    },
    "pow": {"f": "pow({a}, {b})", "i": "({T})br_ipow((long)({a}), (long)({b}))"},
    "maximum": "(({a} > {b} || {a} != {a}) ? {a} : {b})",
    "minimum": "(({a} < {b} || {a} != {a}) ? {a} : {b})",
    "eq": "({a} == {b})",
    "ne": "({a} != {b})",
    "lt": "({a} < {b})",
    "le": "({a} <= {b})",
    "gt": "({a} > {b})",
    "ge": "({a} >= {b})",
    "logical_and": "({a} && {b})",
    "logical_or": "({a} || {b})",
}

TERNARY: dict[str, str] = {"where": "({c} ? {a} : {b})"}

COMPARE = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"}
)
"""Ops whose result is bool while they compute in their operands' promoted type."""

PREAMBLE = """
long br_ipow(long a, long b) {
    long r = 1;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
"""
"""Helper functions the table's expressions call (valid C in both targets; CUDA maps `long`
to 64 bits on Linux, as OpenCL does)."""

FUSABLE = frozenset(UNARY) | frozenset(BINARY) | frozenset(TERNARY) | {"cast"}
"""Elementwise ops a fused kernel can contain."""


def compute_dtype(op: str, in_dtypes: tuple[str, ...], out_dtype: str) -> tuple[str, ...]:
    """The dtype each operand is converted to before the expression runs.

    Arithmetic computes in the result dtype; comparisons in the operands' promoted dtype;
    `where` keeps its bool condition; narrow floats (float16, bfloat16) compute in float32.
    """
    if op == "where":
        return ("bool", _widen(out_dtype), _widen(out_dtype))
    if op == "cast":
        return (_widen(in_dtypes[0]),)
    if op in COMPARE:
        t = in_dtypes[0]
        for d in in_dtypes[1:]:
            t = dtypes.promote(t, d)
        return (_widen(t),) * len(in_dtypes)
    return (_widen(out_dtype),) * len(in_dtypes)


def _widen(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def expression(op: str, compute: str, ctype: str, operands: tuple[str, ...]) -> str:
    """The C expression of `op` over operand expressions, computing in dtype `compute`
    (spelled `ctype` in the target language)."""
    if op == "cast":
        return operands[0]
    entry = UNARY.get(op) or BINARY.get(op) or TERNARY.get(op)
    if entry is None:
        raise KeyError(f"no C expression for op {op!r}")
    if not isinstance(entry, str):
        entry = entry["f" if dtypes.is_float(compute) else "i"]
    names = dict(zip("cab", operands)) if op in TERNARY else dict(zip("abc", operands))
    return entry.format(T=ctype, **names)
