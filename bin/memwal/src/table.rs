//! `memwal init`, `memwal compact`, `memwal gc`, `memwal status`: table
//! setup, maintenance and state (of a table, or of a cluster).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use memwal_compactor::{collect_garbage, Compactor, CompactorConfig, GcConfig, MaintenanceConfig};
use memwal_store::open_store;
use memwal_table::{create_table, TableSharding};

/// Column types `--column NAME:TYPE[:key]` accepts.
const TYPES: &str = "int32, int64, uint64, float32, float64, bool, utf8, large_utf8, binary, \
                     date32, timestamp_us";

fn data_type(name: &str) -> Option<DataType> {
    Some(match name {
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint64" => DataType::UInt64,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "bool" => DataType::Boolean,
        "utf8" | "string" => DataType::Utf8,
        "large_utf8" => DataType::LargeUtf8,
        "binary" => DataType::Binary,
        "date32" => DataType::Date32,
        "timestamp_us" => DataType::Timestamp(TimeUnit::Microsecond, None),
        _ => return None,
    })
}

/// Parses `--column` specs into a schema; `:key` columns form the primary
/// key (in the order given) and are non-nullable, the others nullable.
pub fn parse_schema(columns: &[String]) -> Result<Arc<Schema>, String> {
    if columns.is_empty() {
        return Err("give at least one --column NAME:TYPE[:key]".into());
    }
    let mut fields = Vec::new();
    let mut key_position = 0;
    for spec in columns {
        let parts: Vec<&str> = spec.split(':').collect();
        let (name, ty, key) = match parts.as_slice() {
            [n, t] => (*n, *t, false),
            [n, t, "key"] => (*n, *t, true),
            _ => {
                return Err(format!(
                    "column `{spec}`: expected NAME:TYPE or NAME:TYPE:key"
                ))
            }
        };
        if name.is_empty() {
            return Err(format!("column `{spec}` has no name"));
        }
        let dt = data_type(ty)
            .ok_or_else(|| format!("column `{name}`: unknown type `{ty}` (one of: {TYPES})"))?;
        let mut field = Field::new(name, dt, !key);
        if key {
            key_position += 1;
            field = field.with_metadata(HashMap::from([
                (
                    "lance-schema:unenforced-primary-key".to_string(),
                    "true".to_string(),
                ),
                (
                    "lance-schema:unenforced-primary-key:position".to_string(),
                    key_position.to_string(),
                ),
            ]));
        }
        fields.push(field);
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Parses a duration such as `10m`, `30s`, `7d` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))
}

/// Reads a schema from an Arrow IPC stream or file at `path`; `keys` (in
/// order) become the primary key, non-nullable. Without `keys`, columns the
/// schema itself marks as primary key stay keys.
pub fn read_schema(path: &std::path::Path, keys: &[String]) -> Result<Arc<Schema>, String> {
    let what = || format!("--schema {}", path.display());
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", what()))?;
    let schema = if bytes.starts_with(b"ARROW1") {
        arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
            .map(|r| r.schema())
    } else {
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map(|r| r.schema())
    }
    .map_err(|e| format!("{}: not an Arrow IPC stream or file: {e}", what()))?;
    if schema.fields().is_empty() {
        return Err(format!("{}: the schema has no columns", what()));
    }
    if keys.is_empty() {
        return Ok(schema);
    }
    const KEY: &str = "lance-schema:unenforced-primary-key";
    for k in keys {
        if schema.field_with_name(k).is_err() {
            return Err(format!("--primary-key `{k}`: no such column in {}", what()));
        }
        if keys.iter().filter(|o| *o == k).count() > 1 {
            return Err(format!("--primary-key `{k}` is given twice"));
        }
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut meta = f.metadata().clone();
            meta.remove(KEY);
            meta.remove(&format!("{KEY}:position"));
            let f = f.as_ref().clone();
            match keys.iter().position(|k| k == f.name()) {
                Some(i) => {
                    meta.insert(KEY.to_string(), "true".to_string());
                    meta.insert(format!("{KEY}:position"), (i + 1).to_string());
                    f.with_nullable(false).with_metadata(meta)
                }
                None => f.with_metadata(meta),
            }
        })
        .collect();
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// `memwal init`.
pub async fn init(uri: &str, schema: Arc<Schema>, sharding: &str) -> Result<String, String> {
    let sharding: TableSharding = sharding.parse()?;
    let loc = open_store(uri).map_err(|e| e.to_string())?;
    let table = create_table(&loc, schema, &sharding)
        .await
        .map_err(|e| e.to_string())?;
    let keys: Vec<String> = table
        .schema
        .fields()
        .iter()
        .filter(|f| {
            f.metadata()
                .contains_key("lance-schema:unenforced-primary-key")
        })
        .map(|f| f.name().clone())
        .collect();
    Ok(format!(
        "created table {uri} (version {}), primary key: {}, sharding: {sharding:?}\n",
        table.version,
        if keys.is_empty() {
            "none (append-only)".to_string()
        } else {
            keys.join(", ")
        }
    ))
}

/// A spinner with elapsed time on stderr while `work` runs (hidden when
/// stderr is not a terminal).
async fn with_spinner<T>(what: String, work: impl std::future::Future<Output = T>) -> T {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .expect("static template"),
    );
    bar.set_message(what);
    bar.enable_steady_tick(Duration::from_millis(120));
    let out = work.await;
    bar.finish_and_clear();
    out
}

/// The compactor settings `serve` (and `memwal compact`) derive from the
/// daemon's settings.
pub fn compactor_config(args: &crate::config::ServeConfig) -> CompactorConfig {
    CompactorConfig {
        index_catchup: args
            .index_catchup
            .then(|| Duration::from_secs(args.index_catchup_secs)),
        maintenance: args.maintenance.then(|| MaintenanceConfig {
            target_rows_per_fragment: args.target_fragment_rows,
            materialize_deletions_threshold: args.materialize_deletions_pct as f32 / 100.0,
            ..MaintenanceConfig::default()
        }),
        ..CompactorConfig::default()
    }
}

/// The garbage collection settings `serve` derives from the daemon's
/// settings: with `base_cleanup`, base versions superseded longer ago than
/// the grace period go, and never sooner than the query timeout (a query
/// reads the version it started on until it ends).
pub fn gc_config(args: &crate::config::ServeConfig) -> GcConfig {
    let grace = Duration::from_secs(args.gc_grace_secs);
    let queries = Duration::from_millis(args.query_timeout_ms);
    GcConfig {
        grace,
        base_retention: args.base_cleanup.then_some(grace.max(queries)),
        ..GcConfig::default()
    }
}

/// `memwal compact`: one full cycle (merges, index catch-up, base
/// maintenance); fails when any shard or the maintenance failed.
pub async fn compact(uri: &str) -> Result<String, String> {
    let loc = open_store(uri).map_err(|e| e.to_string())?;
    let compactor = Compactor::new(loc, CompactorConfig::default());
    let reports = with_spinner(format!("compacting {uri}"), compactor.run_once())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    let mut failed = Vec::new();
    for r in reports {
        match r {
            Ok(r) => out.push_str(&format!(
                "shard {}: compacted {} -> {} ({} generations, {} rows, {} tombstones, {} commits)\n",
                r.shard.map(|s| s.to_string()).unwrap_or_default(),
                r.compacted_before,
                r.compacted_after,
                r.merged.len(),
                r.rows_written,
                r.tombstones,
                r.commits
            )),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if out.is_empty() && failed.is_empty() {
        out.push_str("no shards\n");
    }
    match compactor.last_maintenance() {
        Some(Ok(m)) => out.push_str(&format!(
            "base: {} -> {} fragments, {} -> {} deleted rows, {} live rows, version {} ({})\n",
            m.before.fragments,
            m.after.fragments,
            m.before.deleted_rows,
            m.after.deleted_rows,
            m.after.live_rows,
            m.after.version,
            match (&m.skipped, m.committed) {
                (_, true) => format!("rewrote {} fragments", m.fragments_removed),
                (Some(why), false) => format!("nothing rewritten: {why}"),
                (None, false) => "nothing rewritten".to_string(),
            }
        )),
        Some(Err(e)) => failed.push(format!("base maintenance: {e}")),
        None => {}
    }
    if failed.is_empty() {
        Ok(out)
    } else {
        Err(format!("{out}{}", failed.join("\n")))
    }
}

/// `memwal status`: per shard, the manifest's state and the compaction
/// progress, as an aligned table or JSON.
pub async fn status(uri: &str, json: bool) -> Result<String, String> {
    let loc = open_store(uri).map_err(|e| e.to_string())?;
    let retry = memwal_store::RetryPolicy::default();
    let view = memwal_table::table_view(&loc, None, &retry)
        .await
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for s in &view.shards {
        let m = memwal_table::latest_manifest(&loc, s.shard, &retry)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("shard {} lost its manifest", s.shard))?;
        rows.push(serde_json::json!({
            "shard": s.shard.to_string(),
            "values": crate::inspect::shard_values(&m),
            "epoch": m.writer_epoch,
            "version": m.version,
            "generation": m.current_generation,
            "replay_after": m.replay_after_wal_entry_position,
            "wal_last_seen": m.wal_entry_position_last_seen,
            "sstables": m.sstables.len(),
            "compacted": s.floor,
            "lag": s.sstables.len(),
        }));
    }
    if json {
        return Ok(format!(
            "{}\n",
            serde_json::json!({ "table": uri, "base_version": view.base.version().version, "shards": rows })
        ));
    }
    let cols = [
        "shard",
        "values",
        "epoch",
        "version",
        "generation",
        "replay_after",
        "wal_last_seen",
        "sstables",
        "compacted",
        "lag",
    ];
    let mut out = format!(
        "table {uri}: base version {}, {} shards\n",
        view.base.version().version,
        rows.len()
    );
    out.push_str(&crate::inspect::aligned(&cols, &rows));
    Ok(out)
}

/// `memwal gc`.
pub async fn gc(
    uri: &str,
    dry_run: bool,
    grace: Duration,
    keep_manifests: usize,
    base_retention: Option<Duration>,
) -> Result<String, String> {
    let loc = open_store(uri).map_err(|e| e.to_string())?;
    let config = GcConfig {
        grace,
        keep_manifest_versions: keep_manifests,
        base_retention,
        dry_run,
        ..GcConfig::default()
    };
    let what = if dry_run {
        "looking for garbage in"
    } else {
        "collecting garbage in"
    };
    let reports = with_spinner(format!("{what} {uri}"), collect_garbage(&loc, &config))
        .await
        .map_err(|e| e.to_string())?;
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut out = String::new();
    let mut failed = Vec::new();
    for r in reports {
        match r {
            Ok(r) => out.push_str(&format!(
                "shard {}: {verb} {} SSTables, {} abandoned flushes, {} WAL entries, {} manifest versions, {} producer checkpoints ({} objects, {} bytes), {} staged files of crashed writes\n",
                r.shard.map(|s| s.to_string()).unwrap_or_default(),
                r.sstables.len(),
                r.abandoned.len(),
                r.wal_entries.len(),
                r.manifest_versions.len(),
                r.producer_checkpoints.len(),
                r.objects,
                r.bytes,
                r.staged.len()
            )),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if failed.is_empty() {
        Ok(out)
    } else {
        Err(format!("{out}{}", failed.join("\n")))
    }
}

/// `memwal status --cluster ENDPOINTS`: the members of the cluster under
/// `prefix` and every recorded shard with its owner and the member the
/// cluster places it on now (a move is in progress where they differ).
pub async fn cluster_status(endpoints: &str, prefix: &str, json: bool) -> Result<String, String> {
    let endpoints = crate::config::etcd_endpoints(endpoints)?;
    let view = memwal_cluster::read_cluster(&endpoints, prefix)
        .await
        .map_err(|e| e.to_string())?;
    let members: Vec<serde_json::Value> = view
        .members()
        .map(|m| serde_json::json!({ "id": m.id, "advertise": m.advertise }))
        .collect();
    let shards: Vec<serde_json::Value> = view
        .owners()
        .map(|((table, shard), o)| {
            serde_json::json!({
                "table": table,
                "shard": shard,
                "owner": o.member,
                "desired": view.desired(table, shard).map(|m| m.id.clone()),
                "values": o.values,
            })
        })
        .collect();
    // The member compacting each table with recorded shards.
    let tables: std::collections::BTreeSet<&str> =
        view.owners().map(|((t, _), _)| t.as_str()).collect();
    let compactors: serde_json::Map<String, serde_json::Value> = tables
        .iter()
        .map(|t| {
            let m = view.compactor(t).map(|m| m.id.clone());
            (t.to_string(), m.into())
        })
        .collect();
    if json {
        return Ok(format!(
            "{}\n",
            serde_json::json!({
                "revision": view.revision,
                "members": members,
                "compactors": compactors,
                "shards": shards,
            })
        ));
    }
    let mut out = format!(
        "cluster {prefix}: {} members (etcd revision {})\n",
        members.len(),
        view.revision
    );
    for m in view.members() {
        let owned = view.owners().filter(|(_, o)| o.member == m.id).count();
        out.push_str(&format!(
            "  member {} at {}: {owned} shards\n",
            m.id, m.advertise
        ));
    }
    for (table, m) in &compactors {
        out.push_str(&format!(
            "  table {table}: compacted by {}\n",
            m.as_str().unwrap_or("-")
        ));
    }
    for ((table, shard), o) in view.owners() {
        let desired = view
            .desired(table, shard)
            .map(|m| m.id.as_str())
            .unwrap_or("-");
        let moving = if desired == o.member { "" } else { " (moving)" };
        out.push_str(&format!(
            "  {table} {shard}: owner {} desired {desired}{moving}\n",
            o.member
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_specs_parse_and_bad_ones_are_named() {
        let s = parse_schema(&["id:int64:key".into(), "v:utf8".into()]).unwrap();
        assert!(!s.field(0).is_nullable() && s.field(1).is_nullable());
        assert!(s
            .field(0)
            .metadata()
            .contains_key("lance-schema:unenforced-primary-key"));
        for (bad, needle) in [
            ("id", "expected NAME:TYPE"),
            ("id:int128", "unknown type `int128`"),
            (":int64", "has no name"),
            ("id:int64:primary", "expected NAME:TYPE"),
        ] {
            let e = parse_schema(&[bad.to_string()]).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        assert!(parse_schema(&[]).is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("soon").is_err());
    }
}
