"""The GPU kernel families in order of preference: the algorithm pass takes the first that takes a
plan and lists every one that does as a candidate; the tiling pass and the emitter find a plan's
family by its name. The direct kernel takes every problem, so it is last and always a candidate.
A new family is its module and a place in this list.
"""

from __future__ import annotations

from .depthwise import FAMILY as DEPTHWISE
from .direct import FAMILY as DIRECT
from .family import Family
from .igemm import FAMILY as IGEMM
from .stem import FAMILY as STEM

FAMILIES: tuple[Family, ...] = (DEPTHWISE, STEM, IGEMM, DIRECT)
BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}
