"""Bounded JSON numbers as GBNF: exact digit-by-digit grammars for `minimum` / `maximum` /
`exclusiveMinimum` / `exclusiveMaximum`, so every number in range is a sentence and none outside is.

Integers are written as JSON writes them (no leading zeros, no "-0"), at most MAX_DIGITS digits on an
unbounded side (as llama.cpp's converter). Bounded numbers are integers with an optional fraction of at
most MAX_DIGITS digits and no exponent: a narrower language than JSON's numbers, every sentence in range.
This module knows digits and bounds only: no schema, no rule names.
"""

from __future__ import annotations

from decimal import Decimal

MAX_DIGITS = 16
_ANY_MAG = 10 ** MAX_DIGITS - 1  # the largest magnitude an unbounded side reaches


def _alts(parts: list[str]) -> str:
    parts = [p for p in parts if p]
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _digit(lo: int, hi: int) -> str:
    return f'"{lo}"' if lo == hi else f"[{lo}-{hi}]"


def _any_digits(n: int) -> str:
    return "" if n == 0 else f"[0-9]{{{n}}}"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of len(lo) == len(hi) between lo and hi, both inclusive (leading zeros allowed)."""
    if lo == hi:
        return f'"{lo}"'
    n = len(lo)
    l0, h0 = int(lo[0]), int(hi[0])
    if l0 == h0:
        return f'"{lo[0]}" {_same_length(lo[1:], hi[1:])}'
    rest = n - 1
    parts = []
    mid_lo, mid_hi = l0 + 1, h0 - 1
    if rest and lo[1:] != "0" * rest:
        parts.append(f'"{lo[0]}" {_same_length(lo[1:], "9" * rest)}')
    else:
        mid_lo = l0
    if rest and hi[1:] != "9" * rest:
        tail = f'"{hi[0]}" {_same_length("0" * rest, hi[1:])}'
    else:
        tail, mid_hi = "", h0
    if mid_lo <= mid_hi:
        parts.append(f"{_digit(mid_lo, mid_hi)} {_any_digits(rest)}".strip())
    parts.append(tail)
    return _alts(parts)


def magnitude_range(lo: int, hi: int) -> str:
    """Non-negative integers lo..hi (inclusive), written without leading zeros."""
    assert 0 <= lo <= hi
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = min(hi, 10 ** n - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    return _alts(parts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """JSON integers lo..hi, both inclusive (None: unbounded, up to MAX_DIGITS digits); lo <= hi."""
    parts = []
    if lo is None or lo < 0:  # the negatives: magnitudes from max(1, -hi) to -lo
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = _ANY_MAG if lo is None else -lo
        if mag_lo <= mag_hi:
            parts.append(f'"-" {magnitude_range(mag_lo, mag_hi)}')
    if hi is None or hi >= 0:
        parts.append(magnitude_range(max(lo or 0, 0), _ANY_MAG if hi is None else hi))
    return _alts(parts)


# ---- numbers with fractions -------------------------------------------------------------------------------

def _split(d: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and its fraction's digits (no trailing zeros)."""
    i = int(d)  # truncates towards zero: d >= 0
    frac = format(d - i, "f")
    digits = frac.split(".", 1)[1].rstrip("0") if "." in frac else ""
    return i, digits


def _zeros(s: str) -> bool:
    return s.strip("0") == ""


def _fraction(a: str | None, a_incl: bool, b: str | None, b_incl: bool, n: int) -> tuple[list[str], bool]:
    """Digit strings s of length 0..n with 0.a <= 0.s <= 0.b (a bound None: open; incl False: strict):
    the alternatives of the non-empty ones (each starts with its first digit) and whether s may be empty."""
    if a is not None and _zeros(a) and a_incl:
        a = None  # 0.s >= 0 holds for every s
    empty_ok = a is None and (b is None or not _zeros(b) or b_incl)
    if a is None and b is not None and _zeros(b):  # 0.s <= 0: zeros only (< 0: nothing)
        return ([f'"0"{{1,{n}}}'] if n and b_incl else []), empty_ok
    if n == 0:
        return [], empty_ok
    parts: list[str] = []
    run: list[int] = []  # consecutive first digits after which the rest is free

    def flush() -> None:
        if run:
            parts.append(f"{_digit(run[0], run[-1])} {_any_digits_upto(n - 1)}".strip())
            run.clear()

    for c in range(10):
        lower: str | None = None  # the rest's lower bound, or None when the first digit settles it
        upper: str | None = None
        if a is not None:
            a0 = int(a[0]) if a else 0
            if c < a0:
                continue
            lower = a[1:] if c == a0 else None
        if b is not None:
            b0 = int(b[0]) if b else 0
            if c > b0:
                break
            upper = b[1:] if c == b0 else None
        if lower is None and upper is None:
            run.append(c)
            continue
        flush()
        sub = _fraction_expr(lower, a_incl, upper, b_incl, n - 1)
        if sub is not None:
            parts.append(f'"{c}" {sub}'.strip())
    flush()
    return parts, empty_ok


def _any_digits_upto(n: int) -> str:
    return f"[0-9]{{0,{n}}}" if n > 0 else ""


def _fraction_expr(a: str | None, a_incl: bool, b: str | None, b_incl: bool, n: int) -> str | None:
    """_fraction's strings as one GBNF expression ("" for the empty string alone), None when none fits."""
    parts, empty_ok = _fraction(a, a_incl, b, b_incl, n)
    if not parts:
        return "" if empty_ok else None
    return "(" + " | ".join(parts) + ")" + ("?" if empty_ok else "")


def _with_fraction(int_part: str, a: str | None, a_incl: bool, b: str | None, b_incl: bool) -> str:
    """int_part followed by a fraction ("." and 1..MAX_DIGITS digits) within the bounds, or by none where
    the bounds allow that; "" when nothing fits."""
    parts, empty_ok = _fraction(a, a_incl, b, b_incl, MAX_DIGITS)
    if not parts:
        return int_part if empty_ok else ""
    frac = '"." (' + " | ".join(parts) + ")"
    return f"{int_part} ({frac})?" if empty_ok else f"{int_part} {frac}"


def _magnitudes(lo: Decimal, lo_incl: bool, hi: Decimal | None, hi_incl: bool) -> str | None:
    """Non-negative numbers m (integer part, optional fraction) with lo <= m <= hi (strict where not incl)."""
    li, lf = _split(lo)
    if hi is None:
        hi_i, hf = _ANY_MAG, None
    else:
        hi_i, hf = _split(hi)
    full = f"[0-9]{{1,{MAX_DIGITS}}}"
    parts = []
    if li == hi_i:
        parts.append(_with_fraction(f'"{li}"', lf, lo_incl, hf, hi_incl))
    else:
        parts.append(_with_fraction(f'"{li}"', lf, lo_incl, None, True))
        if li + 1 <= hi_i - 1:
            parts.append(f'{magnitude_range(li + 1, hi_i - 1)} ("." {full})?')
        if hf is None:
            parts.append(f'"{hi_i}" ("." {full})?')
        else:
            parts.append(_with_fraction(f'"{hi_i}"', None, True, hf, hi_incl))
    parts = [p for p in parts if p]
    return _alts(parts) if parts else None


def number_range(lo: Decimal | None, lo_incl: bool, hi: Decimal | None, hi_incl: bool) -> str | None:
    """JSON numbers in the interval (None: unbounded; incl False: the bound itself excluded), without an
    exponent; None when the interval holds no number."""
    parts = []
    zero = Decimal(0)
    if lo is None or lo < 0:  # negatives: magnitudes in (max(0, -hi) .. -lo]
        if hi is None or hi >= 0:
            m_lo, m_lo_incl = zero, False
        else:
            m_lo, m_lo_incl = -hi, hi_incl
        m = _magnitudes(m_lo, m_lo_incl, None if lo is None else -lo, lo_incl)
        if m is not None:
            parts.append(f'"-" {m}')
    if hi is None or hi >= 0:
        if lo is None or lo < 0:
            p_lo, p_incl = zero, True
        else:
            p_lo, p_incl = lo, lo_incl
        m = _magnitudes(p_lo, p_incl, hi, hi_incl)
        if m is not None:
            parts.append(m)
    return _alts(parts) if parts else None
