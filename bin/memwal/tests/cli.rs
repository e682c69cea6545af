//! The `memwal` binary end to end on a local directory.

use std::process::Command;

fn memwal(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(args)
        .output()
        .expect("run memwal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Breaks if the CLI does not persist claims (second claim must see epoch 2),
// if seal does not refuse a claim, or if bad input exits 0.
#[test]
fn claim_seal_unseal_show_on_a_local_table() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let table = table.to_str().unwrap();
    let (ok, id, _) = memwal(&["shard", "new-id"]);
    assert!(ok);
    let id = id.trim();
    let base = ["--table", table, "--shard", id];
    let with = |op: &str| {
        let mut v = vec!["shard", op];
        v.extend_from_slice(&base);
        memwal(&v)
    };
    let (ok, out, err) = with("claim");
    assert!(ok, "{err}");
    assert!(out.starts_with("claimed epoch 1\n"), "{out}");
    let (ok, out, _) = with("claim");
    assert!(ok && out.starts_with("claimed epoch 2\n"), "{out}");
    let (ok, out, _) = with("seal");
    assert!(
        ok && out.contains("status: SEALED") && out.contains("writer_epoch: 3"),
        "{out}"
    );
    // Nothing was ever appended, so the seal's fence sentinel is entry 1.
    assert!(out.starts_with("WAL fenced at position 1\n"), "{out}");
    let (ok, _, err) = with("claim");
    assert!(!ok && err.contains("sealed"), "{err}");
    let (ok, out, _) = with("unseal");
    assert!(ok && out.contains("status: ACTIVE"), "{out}");
    let (ok, out, _) = with("show");
    assert!(ok && out.contains("version: 5"), "{out}");

    let (ok, _, err) = memwal(&["shard", "show", "--table", table, "--shard", "not-a-uuid"]);
    assert!(!ok && err.contains("invalid shard id"), "{err}");
}

// Breaks if `init` does not create a table the writer and compactor accept
// (a compact on it must succeed and report no shards), if it accepts a bad
// column spec or an existing table, or if compact/gc refuse a valid table.
#[test]
fn init_compact_and_gc_on_a_local_table() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let table = table.to_str().unwrap();
    let (ok, out, err) = memwal(&[
        "init",
        table,
        "--column",
        "id:int64:key",
        "--column",
        "v:utf8",
        "--sharding",
        "bucket(id, 4)",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("primary key: id"), "{out}");
    let (ok, _, err) = memwal(&["init", table, "--column", "id:int64:key"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = memwal(&["init", &format!("{table}2"), "--column", "id:int99"]);
    assert!(!ok && err.contains("unknown type"), "{err}");
    let (ok, out, err) = memwal(&["compact", table]);
    assert!(ok && out.contains("no shards"), "{out} {err}");
    let (ok, _, err) = memwal(&["gc", table, "--dry-run", "--grace", "0"]);
    assert!(ok, "{err}");
    // A plain directory is not a table.
    let (ok, _, err) = memwal(&["compact", dir.path().to_str().unwrap()]);
    assert!(!ok && err.contains("no Lance table"), "{err}");
}
