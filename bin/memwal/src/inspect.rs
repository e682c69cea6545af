//! `memwal inspect`: one table's shards in depth: the manifest, stored
//! manifest versions, the WAL (every entry listed, the newest decoded),
//! SSTables with their compaction state. Read-only: nothing is claimed.

use futures::TryStreamExt;
use memwal_fencing::{parse_bitrev64, ShardId, ShardLayout};
use memwal_store::{RetryPolicy, StoreLocation};
use memwal_wal::WalLocation;
use serde_json::{json, Value};

/// How many of the newest WAL entries are read and decoded.
const TAIL: usize = 5;

/// Formats `rows` (JSON objects) as a table with the columns `cols`,
/// left-aligned, two spaces apart.
pub fn aligned(cols: &[&str], rows: &[Value]) -> String {
    let cell = |r: &Value, c: &str| match &r[c] {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        v => v.to_string(),
    };
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| {
            rows.iter()
                .map(|r| cell(r, c).len())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut l = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string();
        l.push('\n');
        l
    };
    let mut out = line(cols.iter().map(|c| c.to_string()).collect());
    for r in rows {
        out.push_str(&line(cols.iter().map(|c| cell(r, c)).collect()));
    }
    out
}

/// A manifest's shard field values as `FIELD=HEX,...` (empty: none).
pub fn shard_values(m: &memwal_fencing::ShardManifest) -> String {
    m.shard_field_entries
        .iter()
        .map(|e| {
            let hex: String = e.value.iter().map(|b| format!("{b:02x}")).collect();
            format!("{}={hex}", e.field_id)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Objects under `dir` whose names parse as bitrev64 positions with
/// `suffix`: (position, bytes), ascending.
async fn positions(
    loc: &StoreLocation,
    dir: &object_store::path::Path,
    suffix: &str,
) -> Result<Vec<(u64, u64)>, String> {
    let metas: Vec<_> = loc
        .store
        .list(Some(dir))
        .try_collect()
        .await
        .map_err(|e| format!("listing {dir}: {e}"))?;
    let mut out: Vec<(u64, u64)> = metas
        .iter()
        .filter_map(|m| {
            let name = m.location.filename()?.strip_suffix(suffix)?;
            Some((parse_bitrev64(name)?, m.size))
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

async fn shard_report(
    loc: &StoreLocation,
    shard: ShardId,
    compacted: u64,
    retry: &RetryPolicy,
) -> Result<Value, String> {
    let m = memwal_table::latest_manifest(loc, shard, retry)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("shard {shard} has no manifest"))?;
    let layout = ShardLayout::new(&loc.root, shard);
    let versions = positions(loc, &layout.manifest_dir(), ".binpb").await?;
    let wal = positions(loc, &layout.wal_dir(), ".arrow").await?;
    let wal_loc = WalLocation::new(loc.store.clone(), layout.clone(), retry.clone());
    let mut tail = Vec::new();
    for &(position, bytes) in wal.iter().rev().take(TAIL).rev() {
        let entry = match wal_loc.read_entry(position).await {
            Ok(Some(e)) => json!({
                "position": position,
                "bytes": bytes,
                "epoch": e.epoch,
                "generation": e.generation,
                "rows": e.num_rows(),
                "kind": if e.is_sentinel { "sentinel" } else { "data" },
            }),
            Ok(None) => json!({ "position": position, "bytes": bytes, "kind": "gone" }),
            Err(e) => {
                json!({ "position": position, "bytes": bytes, "kind": format!("unreadable: {e}") })
            }
        };
        tail.push(entry);
    }
    let sstables: Vec<Value> = m
        .sstables
        .iter()
        .map(|s| {
            json!({
                "generation": s.generation,
                "path": s.path,
                "rows": s.physical_rows,
                "memory_bytes": s.in_memory_bytes,
                "state": if s.generation <= compacted { "compacted" } else { "pending" },
            })
        })
        .collect();
    let unflushed = wal
        .iter()
        .filter(|(p, _)| *p > m.replay_after_wal_entry_position)
        .count();
    Ok(json!({
        "shard": shard.to_string(),
        "values": shard_values(&m),
        "spec_id": m.shard_spec_id,
        "manifest": {
            "version": m.version,
            "epoch": m.writer_epoch,
            "status": format!("{:?}", m.status()),
            "current_generation": m.current_generation,
            "replay_after": m.replay_after_wal_entry_position,
            "wal_last_seen": m.wal_entry_position_last_seen,
            "stored_versions": versions.len(),
            "oldest_version": versions.first().map(|v| v.0),
            "newest_version": versions.last().map(|v| v.0),
        },
        "wal": {
            "entries": wal.len(),
            "bytes": wal.iter().map(|(_, b)| b).sum::<u64>(),
            "first": wal.first().map(|w| w.0),
            "last": wal.last().map(|w| w.0),
            "above_replay_cursor": unflushed,
            "tail": tail,
        },
        "compacted_generation": compacted,
        "sstables": sstables,
    }))
}

/// `memwal inspect URI [--shard ID] [--json]`.
pub async fn inspect(uri: &str, shard: Option<&str>, as_json: bool) -> Result<String, String> {
    let loc = memwal_store::open_store(uri).map_err(|e| e.to_string())?;
    let retry = RetryPolicy::default();
    let view = memwal_table::table_view(&loc, None, &retry)
        .await
        .map_err(|e| e.to_string())?;
    let wanted: Vec<ShardId> = match shard {
        Some(s) => {
            let id = ShardId::parse(s).map_err(|e| format!("--shard `{s}`: {e}"))?;
            if !view.shards.iter().any(|v| v.shard == id) {
                return Err(format!("table {uri} has no shard {id}"));
            }
            vec![id]
        }
        None => view.shards.iter().map(|v| v.shard).collect(),
    };
    let mut reports = Vec::new();
    for id in wanted {
        let compacted = view.compacted.get(&id).copied().unwrap_or(0);
        reports.push(shard_report(&loc, id, compacted, &retry).await?);
    }
    let base_version = view.base.version().version;
    if as_json {
        return Ok(format!(
            "{}\n",
            json!({ "table": uri, "base_version": base_version, "shards": reports })
        ));
    }
    let mut out = format!(
        "table {uri}: base version {base_version}, {} shards\n",
        reports.len()
    );
    for r in &reports {
        let m = &r["manifest"];
        let w = &r["wal"];
        out.push_str(&format!(
            "\nshard {} ({}, spec {})\n",
            r["shard"].as_str().unwrap_or(""),
            match r["values"].as_str() {
                Some("") | None => "no shard fields",
                Some(v) => v,
            },
            r["spec_id"]
        ));
        out.push_str(&format!(
            "  manifest v{} ({} stored: v{}..v{}), epoch {}, {}, generation {}, replay after {}, WAL last seen {}\n",
            m["version"], m["stored_versions"], m["oldest_version"], m["newest_version"],
            m["epoch"], m["status"].as_str().unwrap_or(""), m["current_generation"],
            m["replay_after"], m["wal_last_seen"],
        ));
        out.push_str(&format!(
            "  WAL: {} entries, {} bytes, positions {}..{}, {} above the replay cursor\n",
            w["entries"], w["bytes"], w["first"], w["last"], w["above_replay_cursor"]
        ));
        let tail = w["tail"].as_array().cloned().unwrap_or_default();
        if !tail.is_empty() {
            out.push_str(&indent(&aligned(
                &["position", "bytes", "kind", "epoch", "generation", "rows"],
                &tail,
            )));
        }
        out.push_str(&format!(
            "  SSTables (compacted through generation {}):\n",
            r["compacted_generation"]
        ));
        let ssts = r["sstables"].as_array().cloned().unwrap_or_default();
        if ssts.is_empty() {
            out.push_str("    none\n");
        } else {
            out.push_str(&indent(&aligned(
                &["generation", "state", "rows", "memory_bytes", "path"],
                &ssts,
            )));
        }
    }
    Ok(out)
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}
