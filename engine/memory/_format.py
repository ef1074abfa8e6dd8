"""Human-readable byte counts for stats and error messages."""

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: int) -> str:
    """Format a byte count with a binary unit, e.g. ``1.5 MiB``; exact below 1 KiB."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_SUFFIXES = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """Parse a size such as ``512MiB``, ``2G``, ``1.5GB`` or ``1048576`` (for --memory-limit).

    Raises:
        ValueError: the text is not a non-negative number with a known unit.
    """
    raw = text.strip().lower().replace(" ", "").replace("_", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :]
    if unit not in _SUFFIXES or not number:
        raise ValueError(f"not a byte size: {text!r} (try e.g. 512MiB, 2GiB, 1000000)")
    value = float(number)
    if value < 0:
        raise ValueError(f"a byte size cannot be negative: {text!r}")
    return int(value * _SUFFIXES[unit])
