"""The recording names (`call`, `Builder`, `const`, `operand`, `RecordError`) under their
old module: the recording path itself lives with the tensor it makes (`_tensor`), one floor
up from the operator mixin (`_math`). Modules that record ops directly import them here."""

from ._tensor import Builder, RecordError, call, const, operand

__all__ = ["Builder", "RecordError", "call", "const", "operand"]
