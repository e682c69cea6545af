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

/// `memwal init` of a `bucket(id, 4)` table (`id` int64 key, `v` utf8).
fn init_bucket_table(table: &str) -> (bool, String, String) {
    memwal(&[
        "init",
        table,
        "--column",
        "id:int64:key",
        "--column",
        "v:utf8",
        "--sharding",
        "bucket(id, 4)",
    ])
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
    let (ok, out, err) = init_bucket_table(table);
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

// Breaks if `init --schema FILE` loses a column or type of the Arrow IPC
// schema (stream or file form), ignores --primary-key (key, order,
// non-nullable) or the --bucket shorthand, or accepts a key that is not a
// column or a file that is not Arrow IPC.
#[test]
fn init_from_an_arrow_schema_file() {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![
        Field::new("tenant", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            true,
        ),
        Field::new(
            "tags",
            DataType::List(std::sync::Arc::new(Field::new(
                "item",
                DataType::Utf8,
                true,
            ))),
            true,
        ),
    ]);
    let stream = dir.path().join("s.arrows");
    let mut w =
        arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&stream).unwrap(), &schema)
            .unwrap();
    w.finish().unwrap();
    let file = dir.path().join("s.arrow");
    let mut w =
        arrow_ipc::writer::FileWriter::try_new(std::fs::File::create(&file).unwrap(), &schema)
            .unwrap();
    w.finish().unwrap();
    for (n, path) in [&stream, &file].into_iter().enumerate() {
        let table = dir.path().join(format!("t{n}"));
        let table = table.to_str().unwrap();
        let (ok, out, err) = memwal(&[
            "init",
            table,
            "--schema",
            path.to_str().unwrap(),
            "--primary-key",
            "id,tenant",
            "--bucket",
            "id:4",
        ]);
        assert!(ok, "{err}");
        assert!(
            out.contains("primary key: tenant, id") || out.contains("primary key: id, tenant"),
            "{out}"
        );
        assert!(out.contains("Bucket"), "{out}");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let ds = rt.block_on(lance::Dataset::open(table)).unwrap();
        let got = arrow_schema::Schema::from(ds.schema());
        assert_eq!(got.fields().len(), 4);
        for (g, want) in got.fields().iter().zip(schema.fields()) {
            assert_eq!(g.name(), want.name());
            assert_eq!(g.data_type(), want.data_type(), "{}", g.name());
        }
        let pk: Vec<&str> = ds
            .schema()
            .unenforced_primary_key()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(pk, ["id", "tenant"], "key order follows --primary-key");
        assert!(!got.field_with_name("id").unwrap().is_nullable());
    }
    let (ok, _, err) = memwal(&[
        "init",
        dir.path().join("bad").to_str().unwrap(),
        "--schema",
        stream.to_str().unwrap(),
        "--primary-key",
        "nope",
    ]);
    assert!(!ok && err.contains("`nope`"), "{err}");
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"{\"not\": \"arrow\"}").unwrap();
    let (ok, _, err) = memwal(&[
        "init",
        dir.path().join("bad2").to_str().unwrap(),
        "--schema",
        junk.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("not an Arrow IPC"), "{err}");
}

// Breaks if claims racing from separate processes ever give one epoch to
// two claimers, skip an epoch, or let a lost claim bump the epoch (an epoch
// war): 8 processes x 200 rounds on one shard, every win printed.
#[test]
fn claim_races_across_processes_have_one_winner_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let table = table.to_str().unwrap();
    let shard = "6f1c2a9e-4b7d-4f3a-9c1e-2d5b8a7e0f11";
    let children: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
                .args(["shard", "claim", "--table", table, "--shard", shard])
                .args(["--rounds", "200"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut wins: Vec<u64> = Vec::new();
    let mut losses = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match line.split_once(' ') {
                Some(("won", epoch)) => wins.push(epoch.parse().unwrap()),
                Some(("lost", why)) => {
                    assert!(why.contains("claim of shard"), "{why}");
                    losses += 1;
                }
                _ => panic!("unexpected line `{line}`"),
            }
        }
    }
    assert_eq!(wins.len() + losses, 1600);
    wins.sort_unstable();
    let n = wins.len() as u64;
    assert_eq!(
        wins,
        (1..=n).collect::<Vec<u64>>(),
        "each epoch won exactly once, none skipped"
    );
    let (ok, out, err) = memwal(&["shard", "show", "--table", table, "--shard", shard]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("writer_epoch: {n}\n")),
        "the shard ends at the last won epoch {n}: {out}"
    );
}

// Breaks if `memwal load --embedded` reports rows it did not write (the
// base after compaction must hold exactly them), writes nothing, or leaves
// them unflushed at exit (it closes the table: compaction finds them).
#[test]
fn load_embedded_writes_what_it_reports_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let table = table.to_str().unwrap();
    let (ok, _, err) = init_bucket_table(table);
    assert!(ok, "{err}");
    let (ok, out, err) = memwal(&[
        "load",
        "--embedded",
        table,
        "--table",
        "t",
        "--rows",
        "2000",
        "--batch",
        "100",
        "--producers",
        "4",
        "--payload",
        "16",
    ]);
    assert!(ok, "{out} {err}");
    assert!(out.contains("embedded (no Flight): 2000 rows"), "{out}");
    let (ok, out, err) = memwal(&["compact", table]);
    assert!(ok, "{out} {err}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rows = rt.block_on(async {
        lance::Dataset::open(table)
            .await
            .unwrap()
            .count_rows(None)
            .await
            .unwrap()
    });
    assert_eq!(rows, 2000);
}
