"""The prefix store's disk budget: one rule for a document's parts, the snapshot and its archive.

A document's snapshot and archive are kept together or not at all (`engine.prefix_store`), so they
must fit the budget together. The same function decides before a read whether an archive is written
(`engine.recall_plan`, with upper bounds of both files from `engine.estimate`) and, after it, whether
the store keeps what was written (`PrefixStore.put`, `PrefixStore.put_archive`, with the real
sizes). With two rules a book's archive could be written during an hour's read and then refused.

Torch-free: the estimator and the settings dialog use it before any model is loaded.
"""

from __future__ import annotations

import shutil
from functools import lru_cache

from engine import paths

GIB = 1024**3
DEFAULT_SHARE_OF_FREE = 0.25
"""A new installation's prefix-cache budget is this share of the free disk, within the bounds
below: a book's archive alone is ~1 GiB on the default model, so the old fixed 2 GiB evicted a
book's reading within the hour of opening a second one."""
DEFAULT_MIN_BYTES = 2 * GIB
DEFAULT_MAX_BYTES = 32 * GIB


def parts_fit(snapshot_bytes: int, archive_bytes: int, disk_budget_bytes: int) -> bool:
    """Whether a snapshot of `snapshot_bytes` and an archive of `archive_bytes` (0: none) fit a
    prefix-store disk budget of `disk_budget_bytes` together (other entries are evicted for them)."""
    return snapshot_bytes + archive_bytes <= disk_budget_bytes


def default_disk_budget_bytes(free_bytes: int) -> int:
    """The prefix-cache budget for a disk with `free_bytes` free: `DEFAULT_SHARE_OF_FREE` of it,
    whole GiB, between `DEFAULT_MIN_BYTES` and `DEFAULT_MAX_BYTES` (2 GiB on a full disk: a user
    then chooses). Pure."""
    share = int(free_bytes * DEFAULT_SHARE_OF_FREE) // GIB * GIB
    return max(DEFAULT_MIN_BYTES, min(DEFAULT_MAX_BYTES, share))


@lru_cache(maxsize=1)
def sized_for_this_disk() -> int:
    """`default_disk_budget_bytes` for the disk that holds the cache folder (`engine.paths`, or
    $HALAMAN_HOME), measured once per process (a default that moved with every file written
    would make two `EngineSettings()` of one process differ); the minimum when it cannot be measured."""
    folder = paths.cache_location()  # not created: measuring must not leave a folder behind
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return default_disk_budget_bytes(shutil.disk_usage(folder).free)
    except OSError:
        return DEFAULT_MIN_BYTES
