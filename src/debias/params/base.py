"""Shared by every section: the strict :class:`Section` base, bounded value display, colour checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Channel = Annotated[int, Field(ge=0, le=255)]
RGB = Annotated[list[Channel], Field(min_length=3, max_length=3)]  # 0..255 each: fails here, not in a uint8 cast

# Bias colours closer than this (Euclidean distance in RGB, 0..255 per channel) to each other, or to the
# pixels they must stand out from (black background of CMNIST*, white strokes of Biased-MNIST), are refused
# as indistinguishable: an eighth of the closest pair in the papers' palettes (Biased-MNIST: 101.5 between
# (255, 0, 0) and (255, 0, 128); CMNIST*: 214.2), i.e. well beyond sensor-noise-level differences.
MIN_COLOUR_DISTANCE = 12.0
# s_ij = z_i.z_j / tau: float32 cosines of D-dim features carry rounding errors of about sqrt(D) * 2^-24
# (~5e-7 at D = 84, ~1.3e-6 at D = 512); divided by tau they must stay far below a logit unit, so tau >= 1e-4
# (1.3e-2 nats at most). The papers use 0.05 - 0.5.
MIN_TEMPERATURE = 1e-4


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` bounded in depth, length and characters: an error message never echoes an unbounded value
    (a YAML of a few lines can expand, through aliases, into gigabytes)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxlist, shortener.maxdict, shortener.maxstring, shortener.maxother = 3, 6, 6, 60, 60
    text = shortener.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_colours(colours: list[list[int]], key: str, backdrop: tuple[int, int, int], backdrop_name: str) -> None:
    """Refuse colours closer than MIN_COLOUR_DISTANCE to each other or to the ``backdrop`` they are painted against."""
    import math

    for i, first in enumerate(colours):
        if math.dist(first, backdrop) < MIN_COLOUR_DISTANCE:
            raise ValueError(f"{key}[{i}] = {first} cannot be told apart from {backdrop_name} {list(backdrop)}; allowed: "
                             f"an RGB distance of at least {MIN_COLOUR_DISTANCE:g}")
        for j in range(i + 1, len(colours)):
            if math.dist(first, colours[j]) < MIN_COLOUR_DISTANCE:
                raise ValueError(f"{key}[{i}] = {first} and {key}[{j}] = {colours[j]} cannot be told apart; allowed: "
                                 f"colours at least {MIN_COLOUR_DISTANCE:g} apart (RGB distance)")


class Section(BaseModel):
    """Base for every params section: unknown keys are errors, values are validated strictly.

    Strict: no bool where a number is expected (YAML's ``true`` is not 1), no string where a number is
    expected, no float where a whole number is expected; no NaN or infinity anywhere (``allow_inf_nan``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True,
                              allow_inf_nan=False)


def schema_order(declared: Mapping[str, Any], kind: str) -> tuple[str, ...]:
    """The names of the ``declared`` variants (name -> a declaration with ``schema_default``), the one declared the
    schema default first; a DeclarationError unless exactly one is (``kind``: what they are, for the message)."""
    from debias.core.errors import DeclarationError

    defaults = [name for name, spec in declared.items() if spec.schema_default]
    if len(defaults) != 1:
        raise DeclarationError(f"exactly one {kind} must be the schema default; registered: {sorted(declared)}, "
                               f"defaults: {defaults}")
    return (defaults[0], *(name for name in declared if name != defaults[0]))
