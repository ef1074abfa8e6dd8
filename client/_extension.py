"""User-defined ops: declare once (name, attributes, shape rule, gradient, kernels), use anywhere.

An :class:`Extension` is a named, versioned group of ops. Each op it declares is an ordinary
registry op under the wire name ``"<extension>.<op>@<version>"``, so it records lazily like
a built-in, is hashed into graphs (the version with it: a changed extension never replays a
stale plan), is checked by ``graph.validate`` and replays inside cached plans. Kernels are
given per backend kind; one for ``"cpu"`` (NumPy) is enough to run everywhere, since other
backends fall back to it by way of host copies until a native kernel is registered::

    myext = Extension("myext", version="1")

    def _infer(xs, attrs):
        return [(xs[0].shape, xs[0].dtype)]

    scale = myext.op("scale", arity=1, attrs={"by": 2.0}, infer=_infer,
                     grad=lambda b, g, xs, out, a: (g * a["by"],),
                     kernels={"cpu": lambda x, by: x * by})
    y = scale(x, by=3.0)                     # any Tensor, any device

    @scale.kernel("cuda")                    # later, when a native kernel exists
    def _scale_cupy(x, by): ...

To use an extension on a server, install it there and announce it under the entry-point
group ``burn_remote.extensions`` (see ``burn_remote.protocol.extensions``); clients never
send code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from burn_remote.engine import extensions as _engine_ext
from burn_remote.protocol import extensions as _proto_ext
from burn_remote.protocol.registry import NOT_DIFFERENTIABLE, GradRule, InferRule, NotDifferentiable

from ._ops import call


class ExtensionOp:
    """One declared op; call it on Tensors (and attributes) to record it."""

    def __init__(self, extension: Extension, short_name: str, opdef: Any, doc: str) -> None:
        self.extension = extension
        self.short_name = short_name
        self.wire: str = opdef.name
        """Registry and graph name, ``ext.op@version``: what gradient rules pass to ``b.op``."""
        self.opdef = opdef
        self.doc = doc

    @property
    def name(self) -> str:
        """The qualified name without version, ``ext.op``."""
        return f"{self.extension.name}.{self.short_name}"

    def __call__(self, *inputs: Any, **attrs: Any) -> Any:
        return call(self.wire, *inputs, **attrs)

    def kernel(self, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register `fn(*arrays, **attrs)` as this op's kernel on backend `kind`.

        This is the hook for CuPy (``"cuda"``) and OpenCL (``"opencl"``) kernels; the kernel
        receives that backend's arrays and must return arrays of the declared dtype and shape.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            _engine_ext.register_kernel(kind, self.wire, fn)
            return fn

        return register

    def __repr__(self) -> str:
        return f"<extension op {self.wire}>"


class Extension:
    """A namespace of ops with one version, registered in this process when created.

    Bump the version whenever an op's meaning, attributes or kernels change: the version is
    part of every graph hash, and servers refuse graphs whose version they do not have.
    """

    def __init__(self, name: str, version: str = "1", doc: str = "") -> None:
        self._info = _proto_ext.register_extension(name, str(version), doc)
        self.name = name
        self.version = str(version)
        self.doc = doc
        self.ops: dict[str, ExtensionOp] = {}

    def op(
        self,
        name: str,
        *,
        arity: int | None,
        infer: InferRule,
        grad: GradRule | NotDifferentiable | None = NOT_DIFFERENTIABLE,
        attrs: Mapping[str, Any] | None = None,
        n_outputs: int = 1,
        kernels: Mapping[str, Callable[..., Any]] | None = None,
        doc: str = "",
    ) -> ExtensionOp:
        """Declare an op of this extension and register its kernels.

        Args:
            name: short op name (an identifier); the wire name adds extension and version.
            arity: number of tensor operands (None: variadic).
            infer: shape/dtype rule ``(inputs, attrs) -> [(shape, dtype), ...]``; raise
                ``ShapeError`` to refuse operands at the user's line.
            grad: gradient rule ``(b, g, inputs, out, attrs) -> input grads`` over the
                builder; ``NOT_DIFFERENTIABLE`` (the default) makes ``backward()`` through
                the op fail naming it; None means no gradient flows (integer outputs).
            attrs: attribute names with defaults (``registry.REQUIRED`` for mandatory ones).
            n_outputs: outputs per call; multi-output rules get tuples (see registry).
            kernels: backend kind (``"cpu"``, ``"cuda"``, ``"opencl"``) -> kernel
                ``fn(*arrays, **attrs)``; more can be added with ``ExtensionOp.kernel``.
            doc: what the op computes (shown by ``help`` and the registry).
        """
        opdef = _proto_ext.declare_op(
            self._info,
            name,
            arity=arity,
            attrs=attrs,
            infer=infer,
            grad=grad,
            n_outputs=n_outputs,
            doc=doc,
        )
        ext_op = ExtensionOp(self, name, opdef, doc)
        for kind, fn in (kernels or {}).items():
            ext_op.kernel(kind)(fn)
        self.ops[name] = ext_op
        return ext_op

    def __repr__(self) -> str:
        return f"<extension {self.name} {self.version}: {', '.join(self.ops) or 'no ops'}>"
