"""The one error the memory system raises on purpose."""

from ._format import fmt_bytes


class MemoryQuotaExceeded(MemoryError):
    """An allocation would take the device past its memory limit (`--memory-limit`).

    Raised before anything is reserved, so the device stays usable: free tensors and retry, or
    raise the limit. The message names the request, what is in use and reserved, and the limit.
    """

    def __init__(self, requested: int, in_use: int, reserved: int, limit: int, device: str = ""):
        self.requested = requested
        self.in_use = in_use
        self.reserved = reserved
        self.limit = limit
        self.device = device
        where = f" on {device}" if device else ""
        super().__init__(
            f"memory limit exceeded{where}: cannot allocate {fmt_bytes(requested)} "
            f"({requested} bytes); {fmt_bytes(in_use)} in use, {fmt_bytes(reserved)} reserved, "
            f"limit {fmt_bytes(limit)} ({limit} bytes, set by --memory-limit). "
            "Free tensors (drop references) or raise the limit."
        )
