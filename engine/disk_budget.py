"""The prefix store's disk budget: one rule for a document's parts, the snapshot and its archive.

A document's snapshot and archive are kept together or not at all (`engine.prefix_store`), so they
must fit the budget together. The same function decides before a read whether an archive is written
(`engine.recall_plan`, with upper bounds of both files from `engine.estimate`) and, after it, whether
the store keeps what was written (`PrefixStore.put`, `PrefixStore.put_archive`, with the real
sizes). With two rules a book's archive could be written during an hour's read and then refused.

Torch-free: the estimator and the settings dialog use it before any model is loaded.
"""

from __future__ import annotations


def parts_fit(snapshot_bytes: int, archive_bytes: int, disk_budget_bytes: int) -> bool:
    """Whether a snapshot of `snapshot_bytes` and an archive of `archive_bytes` (0: none) fit a
    prefix-store disk budget of `disk_budget_bytes` together (other entries are evicted for them)."""
    return snapshot_bytes + archive_bytes <= disk_budget_bytes
