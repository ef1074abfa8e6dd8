"""Compile the CUDA backend's generated kernels with NVRTC, without a GPU.

The CUDA backend turns every elementwise op and every fused chain into a CuPy
`ElementwiseKernel`; CuPy writes the CUDA C of such a kernel and compiles it with NVRTC on
first launch. Both steps run here without a device: the source comes from CuPy's own code
generation (`_get_elementwise_kernel_code`, the function `ElementwiseKernel.__call__` uses),
with CuPy's headers and compile options (`assemble_cupy_compiler_options`), and NVRTC
compiles for a named architecture. What fails here would fail on the GPU's first launch.

Kernels are compiled in batches (one translation unit of many kernels: the headers are
parsed once per batch); a failing batch is split until the failing kernels are named.
Results are cached by content hash in ``.cache/nvrtc`` so an unchanged kernel set is not
compiled again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from burn_remote.engine.backends import cexpr
from burn_remote.engine.backends.cupy_backend import fused_kernel_source
from burn_remote.engine.fusion import FusedProgram
from burn_remote.protocol import dtypes
from burn_remote.protocol.registry import OPS

ARCHS = ("80", "90")
"""Ampere (A100) and Hopper (H100/H200)."""

BATCH = 160
"""Kernels per translation unit."""

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "nvrtc"

# CuPy's argument kinds (cupy/_core/_kernel.pxd)
_NDARRAY, _INDEXER = 1, 2


@dataclass(frozen=True)
class Source:
    """One kernel as the backend would build it: ElementwiseKernel's three strings."""

    label: str
    in_params: str
    out_params: str
    operation: str
    dtypes_in: tuple[str, ...]
    dtype_out: str


class _S:
    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


def _program_source(label: str, program: FusedProgram) -> Source:
    ins, outs, op = fused_kernel_source(program)
    return Source(label, ins, outs, op, program.inputs, program.out_dtype)


def table_programs() -> Iterator[Source]:
    """Every elementwise op of the expression table over every dtype combination its shape
    rule accepts (what `CupyBackend._table` can generate), and every cast."""
    for op in sorted(cexpr.FUSABLE - {"cast"}):
        arity = 3 if op in cexpr.TERNARY else (1 if op in cexpr.UNARY else 2)
        for combo in itertools.product(dtypes.DTYPES, repeat=arity):
            try:
                ((_, out),) = OPS[op].infer([_S((2,), d) for d in combo], {})
            except Exception:  # a combination the op refuses is never generated
                continue
            refs = tuple(("in", k) for k in range(arity))
            program = FusedProgram(tuple(combo), ((op, refs, out),))
            yield _program_source(f"{op}({', '.join(combo)})", program)
    for src, dst in itertools.product(dtypes.DTYPES, repeat=2):
        program = FusedProgram((src,), (("cast", (("in", 0),), dst),))
        yield _program_source(f"cast({src} -> {dst})", program)


def recorded_programs(programs: Iterable[FusedProgram]) -> Iterator[Source]:
    """Fused programs recorded from real graphs (tests/support/cuda_sim.py records them)."""
    seen = set()
    for program in programs:
        key = (program.inputs, program.instructions)
        if key in seen:
            continue
        seen.add(key)
        ops = "+".join(op for op, _, _ in program.instructions)
        yield _program_source(f"fused {ops} {program.inputs}", program)


# --- CuPy's code generation ------------------------------------------------------------------


def kernel_code(source: Source, name: str, ndim: int = 1, contiguous: bool = True) -> str:
    """The CUDA C CuPy generates for `source` when launched on arrays of `ndim` dims."""
    import cupy
    from cupy._core import _carray, _kernel

    kernel = cupy.ElementwiseKernel(source.in_params, source.out_params, source.operation, name)
    in_types = tuple(dtypes.to_numpy(d) for d in source.dtypes_in)
    _, out_types, type_map = kernel._decide_params_type(in_types, ())
    infos = tuple(
        _kernel._ArgInfo(_NDARRAY, cupy.ndarray, np.dtype(t), ndim, contiguous, True)
        for t in (*in_types, *out_types)
    ) + (_kernel._ArgInfo(_INDEXER, _carray.Indexer, None, ndim, True, True),)
    return _kernel._get_elementwise_kernel_code(
        infos, type_map, kernel.params, kernel.operation, name, ""
    )


def compile_options(arch: str) -> tuple[str, ...]:
    """CuPy's NVRTC options for an ElementwiseKernel, for `arch` (e.g. "90")."""
    from cupy._core import core

    return core.assemble_cupy_compiler_options(()) + (
        "-ftz=true",
        "--device-as-default-execution-space",
        f"-arch=sm_{arch}",
    )


def _header() -> str:
    from cupy._core import core

    includes = "".join(f"#include <{h}>\n" for h in core._cupy_header_list)
    return includes + cexpr.PREAMBLE


def nvrtc_compile(code: str, arch: str) -> str | None:
    """None when NVRTC compiles `code` (with CuPy's headers) for sm_`arch`, else its log."""
    from cupy.cuda import compiler

    prog = compiler._NVRTCProgram(_header() + code, "", (), (), method="cubin")
    try:
        prog.compile(compile_options(arch), None)
    except compiler.CompileException as exc:
        return str(exc)
    return None


@dataclass
class Failure:
    label: str
    arch: str
    log: str


def _key(codes: list[str], arch: str) -> str:
    from cupy.cuda import nvrtc

    h = hashlib.sha256(json.dumps([arch, nvrtc.getVersion(), _header(), codes]).encode())
    return h.hexdigest()


def compile_all(
    sources: list[Source], archs: Iterable[str] = ARCHS, cache: bool = True, variants=True
) -> tuple[int, list[Failure]]:
    """Compile every source (1-d contiguous, and a 3-d strided launch for a sample when
    `variants`) for every arch; returns (kernels compiled, failures)."""
    units: list[tuple[str, str]] = []
    for n, source in enumerate(sources):
        units.append((source.label, kernel_code(source, f"br_check_{n}")))
        if variants and n % 7 == 0:  # broadcasting launches index with strides
            code = kernel_code(source, f"br_check_{n}_nd", ndim=3, contiguous=False)
            units.append((source.label + " [3-d strided]", code))
    failures: list[Failure] = []
    for arch in archs:
        for start in range(0, len(units), BATCH):
            failures += _compile_batch(units[start : start + BATCH], arch, cache)
    return len(units) * len(tuple(archs)), failures


def _compile_batch(units: list[tuple[str, str]], arch: str, cache: bool) -> list[Failure]:
    codes = [code for _, code in units]
    marker = CACHE / _key(codes, arch)
    if cache and marker.exists():
        return []
    log = nvrtc_compile("\n".join(codes), arch)
    if log is None:
        if cache:
            CACHE.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{len(units)} kernels compiled for sm_{arch}\n")
        return []
    if len(units) == 1:
        return [Failure(units[0][0], arch, log)]
    half = len(units) // 2
    return _compile_batch(units[:half], arch, cache) + _compile_batch(units[half:], arch, cache)


def cuda_headers_found() -> str | None:
    """None when CuPy finds NVRTC and the CUDA headers, else why not."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
        compile_options("90")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def env_summary() -> dict[str, Any]:
    import cupy
    from cupy.cuda import nvrtc

    return {"cupy": cupy.__version__, "nvrtc": ".".join(map(str, nvrtc.getVersion()))}


if __name__ == "__main__":  # pragma: no cover - a manual run
    import time

    t0 = time.perf_counter()
    n, failed = compile_all(list(table_programs()), cache=os.environ.get("NOCACHE") is None)
    print(f"{n} kernels compiled, {len(failed)} failed in {time.perf_counter() - t0:.1f} s")
    for f in failed[:10]:
        print(f.label, f.arch, f.log[:400])
