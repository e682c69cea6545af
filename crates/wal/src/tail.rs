//! Finding the last entry of a WAL (docs/memwal-format.md "WAL": recovery probes for
//! the real tail; the search never starts below the replay cursor).

use memwal_fencing::ShardManifest;

use crate::{WalLocation, WalResult};

/// The highest existing WAL position above `floor`, or `floor` when none
/// exists above it. The next free position is the result + 1.
///
/// `floor` is the manifest's `replay_after_wal_entry_position`: positions at
/// or below it may have been deleted by a WAL GC and are never probed.
/// `hint` is `wal_entry_position_last_seen`; any value is fine (0, exact,
/// stale, past the tail, below the floor): it only decides where probing
/// starts.
///
/// Probing relies on the WAL invariant that entry N+1 never exists unless N
/// does, so existence above the floor is a prefix: it gallops forward from
/// the last position known to exist and bisects back to the first missing
/// one. When nothing is found above the floor, probing cannot tell an empty
/// WAL from one whose next positions were deleted by a GC that moved the
/// cursor past our (older) manifest; a LIST of the WAL directory decides.
/// A read failure is retried and then returned, never taken for "missing".
pub async fn find_tail(loc: &WalLocation, floor: u64, hint: u64) -> WalResult<u64> {
    let mut lo = floor;
    let mut hi = None;
    if hint > floor {
        if loc.exists(hint).await? {
            lo = hint;
        } else {
            hi = Some(hint);
        }
    }
    let hi = match hi {
        Some(h) => h,
        None => gallop(loc, lo).await?,
    };
    let tail = bisect(loc, lo, hi).await?;
    if tail > floor {
        return Ok(tail);
    }
    // floor + 1 is missing. That is the end of the WAL unless the floor is
    // 0 (a GC may have deleted a prefix the floor does not know of) or the
    // hint says entries exist above it; only then is a LIST worth its cost
    // (a WAL without GC can hold millions of objects).
    if floor > 0 && hint <= floor {
        return Ok(floor);
    }
    match loc.max_listed_position().await? {
        Some(listed) if listed > floor => {
            tracing::debug!(shard = %loc.shard(), floor, listed, "WAL tail found by LIST above a missing floor + 1");
            probe_up(loc, listed).await
        }
        _ => Ok(floor),
    }
}

/// [`find_tail`] with the manifest's cursor and hint.
pub async fn find_tail_for(loc: &WalLocation, manifest: &ShardManifest) -> WalResult<u64> {
    find_tail(
        loc,
        manifest.replay_after_wal_entry_position,
        manifest.wal_entry_position_last_seen,
    )
    .await
}

/// The highest existing position given that `known` exists.
pub(crate) async fn probe_up(loc: &WalLocation, known: u64) -> WalResult<u64> {
    let hi = gallop(loc, known).await?;
    bisect(loc, known, hi).await
}

/// Smallest probed position above `lo` that is missing, doubling the step.
async fn gallop(loc: &WalLocation, mut lo: u64) -> WalResult<u64> {
    let mut step = 1u64;
    loop {
        let p = lo.saturating_add(step);
        if p == lo {
            // Saturated at u64::MAX: nothing above to probe.
            return Ok(p);
        }
        if !loc.exists(p).await? {
            return Ok(p);
        }
        lo = p;
        step = step.saturating_mul(2);
    }
}

/// Highest existing position in `[lo, hi)` given `lo` exists (or is the
/// floor) and `hi` does not.
async fn bisect(loc: &WalLocation, mut lo: u64, mut hi: u64) -> WalResult<u64> {
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if loc.exists(mid).await? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}
