"""The seed papers the policies come from: title, authors, year and arXiv id, by seed number.

A policy's :attr:`~kvsched.heuristics.spec.PolicySpec.source` starts with its
seed ("seed 003 Sec. 3.1, Table 1"); :func:`paper_for` turns that into the
paper. Titles are those of the seed texts (``/work/shared/seeds`` in the
project's workspace); where arXiv versions differ, :attr:`Paper.note` says how.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Paper:
    """One seed paper.

    Parameters
    ----------
    seed
        The seed number ("000" .. "004").
    title
        Title of the seed text.
    authors
        Family names, in the paper's order.
    year
        Year of the first arXiv version.
    arxiv
        arXiv identifier.
    note
        Versions, or what the seed text lacks.
    """

    seed: str
    title: str
    authors: tuple[str, ...]
    year: int
    arxiv: str
    note: str = ""

    @property
    def short(self) -> str:
        """``Kim et al. 2024, arXiv:2411.07447``."""
        lead = self.authors[0] + (" et al." if len(self.authors) > 2 else f" and {self.authors[1]}")
        return f"{lead} {self.year}, arXiv:{self.arxiv}"

    @property
    def citation(self) -> str:
        """``Kim, Hong, Gulcehre, Ailamaki. Title. 2024. arXiv:2411.07447.``"""
        return f"{', '.join(self.authors)}. {self.title}. {self.year}. arXiv:{self.arxiv}."


#: The seed papers, by seed number.
PAPERS: dict[str, Paper] = {
    p.seed: p
    for p in (
        Paper(
            "000",
            "Optimal Scheduling Algorithms for LLM Inference: Theory and Practice",
            ("Bari", "Hegde", "de Veciana"),
            2025,
            "2508.01002",
            "RAD and SLAI; the seed text carries no venue or date (ACM template header).",
        ),
        Paper(
            "001",
            "Throughput-Optimal Scheduling Algorithms for LLM Inference and AI Agents",
            ("Li", "Dai", "Peng"),
            2025,
            "2504.07347",
            "The seed text (an early version) has no author list; a later version adds Deng.",
        ),
        Paper(
            "002",
            "Optimizing LLM Inference: Fluid-Guided Online Scheduling with Memory Constraints",
            ("Ao", "Luo", "Simchi-Levi", "Wang"),
            2025,
            "2504.11320",
            "WAIT and Nested WAIT; the seed text is v2 (January 2026).",
        ),
        Paper(
            "003",
            "Optimizing LLM Inference for Database Systems: Cost-Aware Scheduling for Concurrent Requests",
            ("Kim", "Hong", "Gulcehre", "Ailamaki"),
            2024,
            "2411.07447",
            "InferMax; arXiv v1 is titled 'The Effect of Scheduling and Preemption on the Efficiency of LLM "
            "Inference Serving', v3 (2025) 'Faster LLM Inference using DBMS-Inspired Preemption and Cache "
            "Replacement Policies'.",
        ),
        Paper(
            "004",
            "Online Scheduling for LLM Inference with KV Cache Constraints",
            ("Jaillet", "Jiang", "Podimata", "Zhou"),
            2025,
            "2502.07115",
            "MC-SF is the seed text's Algorithm 2; later versions add Mellou and Molinaro as authors.",
        ),
    )
}

_SEED = re.compile(r"\bseed (\d{3})\b")


def paper_for(source: str) -> Paper | None:
    """The seed paper a policy source ("seed 003 Sec. 6") names, or ``None``."""
    m = _SEED.search(source)
    return PAPERS.get(m.group(1)) if m else None


__all__ = ["PAPERS", "Paper", "paper_for"]
