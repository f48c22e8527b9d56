"""Token counts written the way the UI shows them."""


def _with_tenths(tenths: int, unit: str) -> str:
    """Write a count of tenths of a unit, dropping a zero decimal."""
    whole, decimal = divmod(tenths, 10)
    return f"{whole}{unit}" if decimal == 0 else f"{whole}.{decimal}{unit}"


def format_tokens(n: int) -> str:
    """Write a token count as "999", "2.5k", "150k" or "1.2M", rounding half up."""
    if n < 0:
        raise ValueError(f"token count must not be negative: {n}")
    if n < 1_000:
        return str(n)
    # Integer arithmetic rounds half up (round() would round half to even) and a
    # count that rounds out of its range moves to the next one: never "10.0k" or "1000k".
    tenths_of_k = (n + 50) // 100
    if tenths_of_k < 100:
        return _with_tenths(tenths_of_k, "k")
    thousands = (n + 500) // 1_000
    if thousands < 1_000:
        return f"{thousands}k"
    return _with_tenths((n + 50_000) // 100_000, "M")
