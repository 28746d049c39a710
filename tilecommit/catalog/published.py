"""A job's published state, as the job API, ``devhost status`` and the completion event show it.

``published`` (the job's item is in pgstac; ``url`` its catalog link: the STAC API's item URL,
or the item's blob when no STAC API is configured) or ``not-configured`` (no catalog: the
``url`` is the item's blob). A job whose summary records no publication (no catalog was
configured when it started, or it started before publication existed) is ``not-configured``.
"""

from __future__ import annotations

PUBLISHED, NOT_CONFIGURED = "published", "not-configured"


def publication_of(summary: dict | None) -> dict | None:
    """The published state of a completed job's summary (None: the job has not completed)."""
    if not summary:
        return None
    recorded = summary.get("published")
    if recorded:
        return recorded
    return {"state": NOT_CONFIGURED, "url": summary.get("stac_url"), "outcome": None}
