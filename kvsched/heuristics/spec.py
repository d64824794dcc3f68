"""A registered policy: its factory, description, paper and default parameters."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsched.heuristics.base import Policy
from kvsched.heuristics.papers import Paper, paper_for


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A registered policy.

    Parameters
    ----------
    name
        Registry name.
    factory
        Builds the policy from ``name=`` and keyword parameters.
    description
        What it does, and where the paper and real engines disagree.
    source
        Seed paper and section.
    defaults
        Parameters it runs with unless overridden.
    """

    name: str
    factory: Callable[..., Policy]
    description: str
    source: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def paper(self) -> Paper | None:
        """The seed paper :attr:`source` names (title, authors, year, arXiv id)."""
        return paper_for(self.source)

    def accepted(self) -> list[str]:
        """Parameter names :func:`make_policy` accepts for this policy."""
        sig = inspect.signature(self.factory)
        return [p for p in sig.parameters if p != "name"]
