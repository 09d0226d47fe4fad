"""go-cty numbers as bake computes them: Go `math/big` Floats, each with its own precision.

A bake number is a binary float whose mantissa has as many bits as its precision says: 512 for
a literal or a string converted to a number, 53 for an env override or a float64 function
(`pow`, `log`), 64 for an integer a function made (`length`, `signum`). Arithmetic rounds its
exact result to the larger precision of its operands (nearest, ties to even), and a number
prints as the shortest decimal that reads back to it at its own precision (`Text('f', -1)`).
So `1/3` prints 155 digits, an env `0.1` plus a literal `1` prints 55. `Num` keeps the exact
value (a dyadic `Fraction`) and the precision, and reproduces both; the sign of zero is kept,
since bake prints `-0`.
"""

import math
import re
from fractions import Fraction

from rocm_assets.core.bake.errors import Unfollowed

LITERAL_PREC = 512
FLOAT_PREC = 53
INT64_PREC = 64
# Binary exponents beyond this are refused: far past any bake file, and their decimals are huge.
MAX_EXPONENT = 4096
MAX_DIGITS = 1000
_INT64 = 1 << 63
# What Go's big.ParseFloat reads in base 10 (cty.ParseNumberVal): no underscores, no hex.
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


class NumberError(ValueError):
    """A number bake refuses (its message is bake's reason)."""


class Num:
    """One bake number: its exact value, the precision it carries, and the sign of a zero."""

    __slots__ = ("negative", "prec", "value")

    def __init__(self, value: Fraction, prec: int, *, negative: bool = False):
        self.value = value
        self.prec = prec
        sign = value.numerator  # cheaper than comparing Fractions
        self.negative = negative if sign == 0 else sign < 0

    def __repr__(self) -> str:
        return f"Num({self.text()}, prec={self.prec})"

    # Numbers order and compare by value, as big.Float.Cmp does (so -0 == 0); a Python int or
    # float compares by its exact value too, so tests can write plain numbers.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Num):
            return self.value == other.value
        if isinstance(other, int) and not isinstance(other, bool):
            return self.value == other
        if isinstance(other, float):
            return equal(self, from_float(other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: "Num") -> bool:
        return self.value < other.value

    def __le__(self, other: "Num") -> bool:
        return self.value <= other.value

    def __gt__(self, other: "Num") -> bool:
        return self.value > other.value

    def __ge__(self, other: "Num") -> bool:
        return self.value >= other.value

    def is_int(self) -> bool:
        return self.value.denominator == 1

    def text(self) -> str:
        """big.Float.Text('f', -1): the shortest decimal that reads back at this precision."""
        return go_text(self.value, self.prec, self.negative)


def _round(value: Fraction, prec: int) -> Fraction:
    """`value` rounded to `prec` significant bits, nearest with ties to even (big.ToNearestEven)."""
    numerator, denominator = value.numerator, value.denominator
    if denominator & (denominator - 1) == 0 and abs(numerator).bit_length() <= prec:
        return value  # a dyadic value that fits: most numbers, and every small integer
    sign = -1 if value < 0 else 1
    magnitude = abs(value)
    # 2**(exp-1) <= magnitude < 2**exp
    exp = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exp <= magnitude:
        exp += 1
    if abs(exp) > MAX_EXPONENT:
        raise Unfollowed("a number with a binary exponent beyond 4096")
    scaled = magnitude * Fraction(2) ** (prec - exp)
    mantissa, rest = divmod(scaled.numerator, scaled.denominator)
    twice = 2 * rest
    if twice > scaled.denominator or (twice == scaled.denominator and mantissa & 1):
        mantissa += 1
    return sign * Fraction(mantissa) * Fraction(2) ** (exp - prec)


def make(value: Fraction, prec: int, *, negative: bool = False) -> Num:
    return Num(_round(value, prec), prec, negative=negative)


def literal(text: str) -> Num:
    """A number literal or a string converted to a number (cty.ParseNumberVal): 512 bits."""
    text = text.strip() if text.strip() == text else text
    if not _DECIMAL.fullmatch(text):
        raise NumberError("a number is required")
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa) > MAX_DIGITS:
        raise Unfollowed(f"a number written with over {MAX_DIGITS} digits")
    if exponent and abs(int(exponent)) > MAX_EXPONENT:
        raise Unfollowed("a number with a decimal exponent beyond 4096")
    value = Fraction(mantissa.lstrip("+") or "0") * Fraction(10) ** int(exponent or 0)
    return make(value, LITERAL_PREC, negative=text.startswith("-"))


def from_float(value: float) -> Num:
    """A float64 made a number (big.NewFloat): 53 bits."""
    if not math.isfinite(value):
        raise Unfollowed("an infinite number")
    return Num(Fraction(value), FLOAT_PREC, negative=math.copysign(1.0, value) < 0)


def from_int(value: int, prec: int | None = None) -> Num:
    """An integer made a number: SetInt64 (64 bits) or SetInt (its bit length, at least 64)."""
    return make(Fraction(value), prec or max(INT64_PREC, value.bit_length()))


def to_int64(num: Num) -> int:
    """A whole number as go-cty converts it to a Go int."""
    if not num.is_int() or not -_INT64 <= num.value < _INT64:
        raise NumberError(
            "value must be a whole number, between -9223372036854775808 and 9223372036854775807"
        )
    return int(num.value)


def to_float(num: Num) -> float:
    """A number as go-cty converts it to a Go float64 (nearest)."""
    if num.value == 0:
        return -0.0 if num.negative else 0.0
    try:
        return float(num.value)
    except OverflowError:
        raise Unfollowed("a number beyond a float64, given to a float64 function") from None


# ---- arithmetic: the result has the larger precision of the operands ----
def add(a: Num, b: Num) -> Num:
    both_negative_zero = a.value == 0 and b.value == 0 and a.negative and b.negative
    return make(a.value + b.value, max(a.prec, b.prec), negative=both_negative_zero)


def sub(a: Num, b: Num) -> Num:
    zero_signs = a.value == 0 and b.value == 0 and a.negative and not b.negative
    return make(a.value - b.value, max(a.prec, b.prec), negative=zero_signs)


def mul(a: Num, b: Num) -> Num:
    return make(a.value * b.value, max(a.prec, b.prec), negative=a.negative != b.negative)


def quo(a: Num, b: Num) -> Num:
    if b.value == 0:
        if a.value == 0:
            raise NumberError("can't divide zero by zero or infinity by infinity")
        raise Unfollowed("a division by zero (bake makes an infinity)")
    return make(a.value / b.value, max(a.prec, b.prec), negative=a.negative != b.negative)


def neg(a: Num) -> Num:
    return Num(-a.value, a.prec, negative=not a.negative)


def absolute(a: Num) -> Num:
    return Num(abs(a.value), a.prec)


def modulo(a: Num, b: Num) -> Num:
    """go-cty's Modulo: a - b * trunc(a / b), at a's precision; anything % 0 is a itself."""
    if b.value == 0:
        return a
    ratio = quo(a, b).value
    whole = make(Fraction(math.trunc(ratio)), a.prec)
    return sub(Num(a.value, a.prec, negative=a.negative), mul(Num(b.value, a.prec), whole))


def equal(a: Num, b: Num) -> bool:
    """cty's number equality: whole numbers exactly, others by their printed form."""
    if (a.value > 0) != (b.value > 0) or (a.value < 0) != (b.value < 0):
        return False
    if a.is_int() or b.is_int():
        return a.value == b.value
    return go_text(a.value, a.prec, False) == go_text(b.value, b.prec, False)


# ---- printing: math/big's ftoa (roundShortest and fmtF), digit for digit ----
def _decimal(mantissa: int, shift: int) -> tuple[str, int]:
    """mantissa * 2**shift as decimal digits (no trailing zeros) and exponent: 0.digits x 10**exp."""
    if mantissa == 0:
        return "", 0
    if shift >= 0:
        digits = str(mantissa << shift)
        exp = len(digits)
    else:
        digits = str(mantissa * 5**-shift)
        exp = len(digits) + shift
    trimmed = digits.rstrip("0")
    return trimmed, exp if trimmed else 0


def _round_digits(digits: str, exp: int, n: int, how: str) -> tuple[str, int]:
    if n < 0 or n >= len(digits):
        return digits, exp
    if how == "nearest":
        if digits[n] == "5" and n + 1 == len(digits):
            how = "up" if n > 0 and int(digits[n - 1]) % 2 else "down"
        else:
            how = "up" if digits[n] >= "5" else "down"
    if how == "down":
        kept = digits[:n].rstrip("0")
        return kept, exp if kept else 0
    while n > 0 and digits[n - 1] >= "9":
        n -= 1
    if n == 0:
        return "1", exp + 1
    return digits[: n - 1] + chr(ord(digits[n - 1]) + 1), exp


def _exact(value: Fraction) -> tuple[int, int]:
    """A nonzero dyadic |value| as (odd numerator, binary exponent)."""
    magnitude = abs(value)
    numerator, denominator = magnitude.numerator, magnitude.denominator
    zeros = (numerator & -numerator).bit_length() - 1
    return numerator >> zeros, zeros - (denominator.bit_length() - 1)


def _shortest(value: Fraction, prec: int) -> tuple[str, int]:
    """math/big's roundShortest: the fewest digits that read back at `prec` bits."""
    numerator, shift = _exact(value)
    digits, exp = _decimal(numerator, shift)
    top = numerator.bit_length() + shift  # the binary exponent: 0.1xxx x 2**top
    half_ulp_exp = top - (prec + 1)
    if shift < half_ulp_exp:  # cannot happen for a rounded value
        raise Unfollowed("a number with more bits than its precision")
    mant = numerator << (shift - half_ulp_exp)
    lower, _ = _decimal(mant - 1, half_ulp_exp)
    upper, _ = _decimal(mant + 1, half_ulp_exp)
    inclusive = mant & 2 == 0
    for i, m in enumerate(digits):
        low = lower[i] if i < len(lower) else "0"
        up = upper[i] if i < len(upper) else "0"
        okdown = low != m or (inclusive and i + 1 == len(lower))
        okup = m != up and (inclusive or chr(ord(m) + 1) < up or i + 1 < len(upper))
        if okdown and okup:
            return _round_digits(digits, exp, i + 1, "nearest")
        if okdown:
            return _round_digits(digits, exp, i + 1, "down")
        if okup:
            return _round_digits(digits, exp, i + 1, "up")
    return digits, exp


def _fmt_f(digits: str, exp: int, places: int) -> str:
    whole = digits[:exp] + "0" * max(exp - len(digits), 0) if exp > 0 else "0"
    if not places:
        return whole
    fraction = "".join(digits[j] if 0 <= j < len(digits) else "0" for j in range(exp, exp + places))
    return f"{whole}.{fraction}"


def _fmt_e(digits: str, exp: int, places: int) -> str:
    out = digits[:1] or "0"
    if places > 0:
        out += "." + digits[1 : places + 1] + "0" * max(places + 1 - max(len(digits), 1), 0)
    power = exp - 1 if digits else 0
    return f"{out}e{'-' if power < 0 else '+'}{abs(power):02d}"


def go_text(value: Fraction, prec: int, negative: bool) -> str:
    """big.Float.Text('f', -1)."""
    sign = "-" if negative else ""
    if value == 0:
        return sign + "0"
    digits, exp = _shortest(value, prec)
    return sign + _fmt_f(digits, exp, max(len(digits) - exp, 0))


def text_g(num: Num) -> str:
    """big.Float.Text('g', -1), as format's %v writes a number."""
    sign = "-" if num.negative else ""
    digits, exp = _shortest(num.value, num.prec) if num.value else ("", 0)
    if exp - 1 < -4 or exp - 1 >= 6:
        return sign + _fmt_e(digits, exp, len(digits) - 1)
    return sign + _fmt_f(digits, exp, max(len(digits) - exp, 0))


def fixed(num: Num, places: int) -> str:
    """big.Float.Text('f', places): the exact value rounded half to even, no sign."""
    if num.value == 0:
        return _fmt_f("", 0, places)
    digits, exp = _decimal(*_exact(num.value))
    digits, exp = _round_digits(digits, exp, exp + places, "nearest")
    return _fmt_f(digits, exp, places)
