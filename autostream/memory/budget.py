"""The memory budget of a plan: how far its predicted peak may rise above one stream's.

``max_memory_increase`` (``AutoStreamPass``, ``autostream.backend``, ``autostream plan
--max-memory-increase``) is a percentage of the single-stream peak (``"10%"``; in Python
also a fraction up to 1, ``0.1``), a size (``"512MiB"``, ``"1GB"``, ``"4096B"``), both
(``"10%,2MiB"``: whichever allows more), or ``None``/``"none"`` for no budget.  ``0``:
never above the single-stream peak.  Text never holds a bare number other than ``0``
(``"10"`` could mean 10% or +1000%), and a Python number above 1 is refused for the
same reason: write ``"1000%"``.

The default, :data:`DEFAULT_MAX_MEMORY_INCREASE` = ``"10%,2MiB"``, has the shape of
PyTorch's overlap scheduler's (it refuses reorders that raise the peak by more than
``max(5%, 1 GiB)``).  The peak includes the weights and other inputs: where they
dominate (decode-style inference) 10% leaves the plan free, and where activations
dominate (prefill, large batches) it stops a plan from keeping whole branches'
activations alive side by side while allowing the modest lifetime extension of
values read across streams.  2 MiB is the granularity of PyTorch's CUDA caching
allocator (small tensors come from 2 MiB segments, larger ones are rounded to
2 MiB): a smaller rise rarely changes what the allocator reserves, so tiny graphs
are never held back for it.

>>> MemoryBudget.parse("10%").limit(1000), MemoryBudget.parse("1KiB").limit(1000)
(1100, 2024)
>>> MemoryBudget.parse("10%,1KiB").limit(100_000)
110000
>>> MemoryBudget.parse(-1)
Traceback (most recent call last):
...
ValueError: max_memory_increase must be >= 0 (a percentage of the single-stream peak such as '10%', a size such as '512MiB', both as '10%,2MiB', 0, or 'none'), got -1
>>> MemoryBudget.parse("10", option="--max-memory-increase")
Traceback (most recent call last):
...
ValueError: --max-memory-increase: '10' is a bare number: write '10%' for a percentage of the single-stream peak, or a size with its unit such as '10MiB' (accepted: a percentage of the single-stream peak such as '10%', a size such as '512MiB', both as '10%,2MiB', 0, or 'none')
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_MEMORY_INCREASE", "MemoryBudget", "format_bytes"]

#: 10% of the single-stream peak or 2 MiB, whichever is more (see the module docstring)
DEFAULT_MAX_MEMORY_INCREASE = "10%,2MiB"

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)\s*$", re.I)
_FORMS = ("a percentage of the single-stream peak such as '10%', a size such as '512MiB', "
          "both as '10%,2MiB', 0, or 'none'")


@dataclass(frozen=True)
class MemoryBudget:
    """At most ``fraction`` of the single-stream peak or ``nbytes`` above it (the larger,
    when both are set)."""

    fraction: float | None = None
    nbytes: int | None = None

    @classmethod
    def parse(cls, value: float | str | None, option: str = "max_memory_increase"
              ) -> MemoryBudget | None:
        """A budget from a fraction, a percentage, a size with its unit, or ``None``/``"none"``.

        ``option`` names the setting in error messages.

        >>> MemoryBudget.parse(0.25), MemoryBudget.parse("2 MB")
        (MemoryBudget(fraction=0.25, nbytes=None), MemoryBudget(fraction=None, nbytes=2000000))
        >>> MemoryBudget.parse("lots", option="--max-memory-increase")
        Traceback (most recent call last):
        ...
        ValueError: --max-memory-increase: cannot read 'lots'; give a percentage of the single-stream peak such as '10%', a size such as '512MiB', both as '10%,2MiB', 0, or 'none'
        >>> MemoryBudget.parse("10%,2MiB,3")
        Traceback (most recent call last):
        ...
        ValueError: max_memory_increase: '10%,2MiB,3' has 3 parts; give at most a percentage and a size, as '10%,2MiB'
        """
        if value is None or isinstance(value, str) and value.strip().lower() == "none":
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{option} must be a number or a string ({_FORMS}), "
                             f"got {type(value).__name__} {value!r}")
        if isinstance(value, str):
            texts = value.split(",")
            if len(texts) > 2:
                raise ValueError(f"{option}: {value!r} has {len(texts)} parts; give at most a "
                                 f"percentage and a size, as '10%,2MiB'")
            parts = [cls._parse_text(p, option) for p in texts]
            if len(parts) == 2 and (parts[0].fraction is None) == (parts[1].fraction is None):
                raise ValueError(f"{option}: {value!r} gives two "
                                 f"{'sizes' if parts[0].fraction is None else 'percentages'}; "
                                 f"give at most a percentage and a size, as '10%,2MiB'")
            return cls(fraction=max((p.fraction for p in parts if p.fraction is not None),
                                    default=None),
                       nbytes=max((p.nbytes for p in parts if p.nbytes is not None),
                                  default=None))
        number = _checked(float(value), value, option)
        if number > 1:
            raise ValueError(f"{option}={value!r}: a number is a fraction of the single-stream "
                             f"peak (0.1 is +10%), and {value!r} would allow "
                             f"+{100 * value:g}%; write '{value:g}%' for a percentage, "
                             f"'{100 * value:g}%' if you mean it, or a size such as '512MiB'")
        return cls(fraction=number)

    @classmethod
    def _parse_text(cls, text: str, option: str) -> MemoryBudget:
        raw = text.strip()
        try:
            if raw.endswith("%"):
                return cls(fraction=_checked(float(raw[:-1]) / 100, text, option))
            number = float(raw)
        except ValueError as exc:
            if "must be" in str(exc):
                raise
        else:
            if number == 0:
                return cls(fraction=0.0)
            _checked(number, text, option)
            raise ValueError(f"{option}: {text.strip()!r} is a bare number: write "
                             f"'{raw}%' for a percentage of the single-stream peak, or a size "
                             f"with its unit such as '{raw}MiB' (accepted: {_FORMS})")
        m = _SIZE.match(raw)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{option}: cannot read {text!r}; give {_FORMS}")
        size = _checked(float(m.group(1)) * _UNITS[m.group(2).lower()], text, option)
        return cls(nbytes=int(size))

    def allowed_increase(self, single_stream_peak: int) -> int:
        """Bytes a plan may add to the single-stream peak."""
        share = int(math.floor(single_stream_peak * (self.fraction or 0.0)))
        return max(share, self.nbytes or 0)

    def limit(self, single_stream_peak: int) -> int:
        """The most bytes a plan's predicted peak may reach."""
        return single_stream_peak + self.allowed_increase(single_stream_peak)

    def describe(self) -> str:
        """``"+10%"``, ``"+512.0 MiB"`` or both.

        >>> MemoryBudget(fraction=0.1, nbytes=2**21).describe()
        '+10% or +2.0 MiB'
        """
        parts = ([f"+{100 * self.fraction:g}%"] if self.fraction is not None else []) + (
            [f"+{format_bytes(self.nbytes)}"] if self.nbytes is not None else [])
        return " or ".join(parts)


def _checked(number: float, shown: object, option: str) -> float:
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise ValueError(f"{option} must be >= 0 ({_FORMS}), got {shown!r}"
                         + ("; use None for no budget" if number == math.inf else ""))
    return number


def format_bytes(n: float) -> str:
    """Bytes with a binary unit.

    >>> format_bytes(512), format_bytes(3 * 2**20)
    ('512 B', '3.0 MiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
