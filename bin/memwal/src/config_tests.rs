//! `config`'s tests: layering, validation, printing.
#![allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error

use super::*;

// Breaks if a layer is skipped or the precedence is not defaults < file
// < flags < environment, or if a bad value is accepted.
#[test]
fn layers_override_in_order() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "memwal.toml",
            "listen = \"127.0.0.1:1\"\nhttp = \"127.0.0.1:2\"\ncompact_every_secs = 5\n[tables]\na = \"/x\"\n",
        )?;
        let args = ServeArgs {
            config: Some("memwal.toml".into()),
            http: Some("127.0.0.1:3".parse().unwrap()),
            compact_every_secs: Some(7),
            ..Default::default()
        };
        jail.set_env("MEMWAL_COMPACT_EVERY_SECS", "9");
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.listen.port(), 1, "file over default");
        assert_eq!(c.http.port(), 3, "flag over file");
        assert_eq!(c.compact_every_secs, 9, "environment over flag");
        assert_eq!(c.tables.get("a").map(String::as_str), Some("/x"));
        assert!(c.compactor, "default kept");
        jail.set_env("MEMWAL_LISTEN", "not an address");
        let e = resolve(&args).unwrap_err();
        assert!(e.to_lowercase().contains("listen"), "{e}");
        Ok(())
    });
}

#[test]
fn bucket_lists_parse_and_bad_ones_are_refused() {
    assert_eq!(parse_buckets("0-1,3").unwrap(), vec![0, 1, 3]);
    assert_eq!(parse_buckets("2, 2,1").unwrap(), vec![1, 2]);
    for bad in ["", "a", "3-1", "1-", "-1"] {
        assert!(parse_buckets(bad).is_err(), "{bad}");
    }
    figment::Jail::expect_with(|jail| {
        jail.set_env("MEMWAL_SHARDS", "{t=\"0-1\"}");
        let args = ServeArgs {
            tables: vec!["t=/x".into()],
            ..Default::default()
        };
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.shards.get("t").map(String::as_str), Some("0-1"));
        let bad = ServeArgs {
            shards: vec!["t=x".into()],
            ..args
        };
        jail.set_env("MEMWAL_SHARDS", "{}");
        assert!(resolve(&bad).unwrap_err().contains("shards of `t`"));
        Ok(())
    });
}

// Breaks if a token file is not read (first line, trimmed), if it can
// be combined with a token, or if an empty token is accepted (a daemon
// that looks protected and is not).
#[test]
fn the_token_comes_from_a_file_and_an_empty_one_is_refused() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("tok", "s3cret\nignored\n")?;
        jail.create_file("empty", "\n")?;
        let args = ServeArgs {
            tables: vec!["t=/x".into()],
            token_file: Some("tok".into()),
            ..Default::default()
        };
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        let both = ServeArgs {
            token: Some("x".into()),
            ..args.clone()
        };
        assert!(resolve(&both).unwrap_err().contains("not both"));
        let empty = ServeArgs {
            token_file: Some("empty".into()),
            ..args.clone()
        };
        assert!(resolve(&empty).unwrap_err().contains("empty"));
        jail.set_env("MEMWAL_TOKEN", "");
        let env_empty = ServeArgs {
            token_file: None,
            ..args
        };
        assert!(resolve(&env_empty).unwrap_err().contains("empty"));
        Ok(())
    });
}

#[test]
fn nothing_to_serve_and_bad_tables_are_refused() {
    figment::Jail::expect_with(|_| {
        assert!(resolve(&ServeArgs::default())
            .unwrap_err()
            .contains("data directory"));
        let bad = ServeArgs {
            tables: vec!["noequals".into()],
            ..Default::default()
        };
        assert!(resolve(&bad).unwrap_err().contains("NAME=URI"));
        Ok(())
    });
}

// Breaks if the example file stops loading, or a settings key is added
// without documenting it there.
#[test]
fn the_example_config_loads_and_lists_every_key() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/memwal.toml");
    let text = std::fs::read_to_string(example).unwrap();
    figment::Jail::expect_with(|_| {
        let args = ServeArgs {
            config: Some(example.into()),
            ..Default::default()
        };
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.writer.to_config().map(|_| ()), Ok(()));
        assert_eq!(
            c.writer.filled(),
            c.writer,
            "the example sets every writer key"
        );
        let mut full = c.clone();
        full.token = Some("t".into());
        full.token_file = Some("f".into());
        full.tls_cert = Some("c".into());
        full.tls_key = Some("k".into());
        full.tables.insert("t".into(), "/t".into());
        full.shards.insert("t".into(), "0".into());
        full.cluster = Some("etcd://e:1".into());
        full.advertise = Some("grpc+tls://a:1".into());
        full.cluster_tls_ca = Some("ca".into());
        let printed: toml::Table = toml::from_str(&print(&full)?).unwrap();
        let keys = printed.iter().flat_map(|(k, v)| match v {
            toml::Value::Table(t) if k == "writer" => t.keys().cloned().collect(),
            _ => vec![k.clone()],
        });
        for key in keys {
            let documented = text.lines().any(|l| {
                let l = l.trim_start_matches(['#', ' ']);
                l.starts_with(&format!("{key} =")) || l.starts_with(&format!("[{key}]"))
            });
            assert!(documented, "docs/memwal.toml does not document `{key}`");
        }
        Ok(())
    });
}

// Breaks if [writer] keys do not layer (file < flag < environment),
// an unknown or invalid key is accepted, or a token is printed.
#[test]
fn writer_settings_layer_and_bad_ones_are_named() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "memwal.toml",
            "data_dir = \"d\"\ntoken = \"s3cret\"\n[writer]\nflush_concurrency = 3\nmemtable_max_mib = 8\nclose_timeout_secs = 5\n",
        )?;
        let args = ServeArgs {
            config: Some("memwal.toml".into()),
            writer: vec![
                "memtable_max_mib=16".into(),
                "sstable_compression=lance".into(),
            ],
            ..Default::default()
        };
        jail.set_env("MEMWAL_WRITER_CLOSE_TIMEOUT_SECS", "9");
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.writer.flush_concurrency, Some(3), "file");
        assert_eq!(c.writer.memtable_max_mib, Some(16), "flag over file");
        assert_eq!(
            c.writer.close_timeout_secs,
            Some(9),
            "environment over file"
        );
        let w = c.writer.to_config().map_err(|e| e.to_string())?;
        assert_eq!(w.memtable_max_bytes, 16 << 20);
        assert_eq!(w.sstable_compression, memwal::SsTableCompression::Lance);
        let printed = print(&c)?;
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("flush_retry_attempts = 8"), "{printed}");
        assert!(printed.contains("producer_expiry_hours = 168"), "{printed}");
        jail.set_env("MEMWAL_WRITER_FLUSH_CONCURRENCY", "0");
        let e = resolve(&args).unwrap_err();
        assert!(e.contains("writer.flush_concurrency"), "{e}");
        jail.set_env("MEMWAL_WRITER_FLUSH_CONCURRENCY", "2");
        let args = ServeArgs {
            config: Some("memwal.toml".into()),
            ..Default::default()
        };
        jail.create_file(
            "memwal.toml",
            "data_dir = \"d\"\n[writer]\nflush_concurency = 3\n",
        )?;
        let e = resolve(&args).unwrap_err();
        assert!(e.contains("flush_concurency"), "{e}");
        jail.create_file(
            "memwal.toml",
            "data_dir = \"d\"\n[writer]\nsstable_compression = \"zip\"\n",
        )?;
        let e = resolve(&args).unwrap_err();
        assert!(
            e.contains("sstable_compression") || e.contains("zip"),
            "{e}"
        );
        Ok(())
    });
}

// Breaks if the cluster settings are not layered like every other setting,
// if an etcd endpoint list is misread, or if a combination that cannot
// work (no advertise address, static shard lists, TLS without a CA for the
// members or a plaintext advertised address, a failover shorter than etcd's
// shortest lease) is accepted.
#[test]
fn cluster_settings_layer_and_bad_ones_are_refused() {
    assert_eq!(
        etcd_endpoints("etcd://a:2379, http://b:2379,c:1").unwrap(),
        ["http://a:2379", "http://b:2379", "http://c:1"]
    );
    for bad in ["", " , ", "a", "https://a:1", "etcd://a"] {
        assert!(etcd_endpoints(bad).is_err(), "{bad}");
    }
    figment::Jail::expect_with(|jail| {
        let args = ServeArgs {
            tables: vec!["t=/x".into()],
            cluster: Some("etcd://e:2379".into()),
            advertise: Some("grpc://10.0.0.1:50051".into()),
            ..Default::default()
        };
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster_failover_ms, 10_000, "default");
        assert_eq!(c.cluster_prefix, "/memwal", "default");
        jail.set_env("MEMWAL_CLUSTER_FAILOVER_MS", "4000");
        jail.set_env("MEMWAL_ADVERTISE", "grpc://10.0.0.2:1");
        let c = resolve(&args).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster_failover_ms, 4000, "environment");
        assert_eq!(c.advertise.as_deref(), Some("grpc://10.0.0.2:1"));
        jail.set_env("MEMWAL_CLUSTER_FAILOVER_MS", "1000");
        assert!(resolve(&args).unwrap_err().contains("cluster_failover_ms"));
        jail.set_env("MEMWAL_CLUSTER_FAILOVER_MS", "4000");
        jail.set_env("MEMWAL_ADVERTISE", "");
        assert!(resolve(&args).unwrap_err().contains("advertise"));
        jail.set_env("MEMWAL_ADVERTISE", "grpc://10.0.0.2:1");
        let with_shards = ServeArgs {
            shards: vec!["t=0".into()],
            ..args.clone()
        };
        assert!(resolve(&with_shards).unwrap_err().contains("shards"));
        for bad in [
            "grpc+tls://10.0.0.2:1",
            "http://10.0.0.2:1",
            "grpc://10.0.0.2",
            "grpc://:1",
        ] {
            jail.set_env("MEMWAL_ADVERTISE", bad);
            assert!(resolve(&args).unwrap_err().contains(bad), "{bad}");
        }
        jail.set_env("MEMWAL_ADVERTISE", "grpc://10.0.0.2:1");
        let tls = ServeArgs {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("k.pem".into()),
            ..args.clone()
        };
        assert!(resolve(&tls).unwrap_err().contains("grpc+tls://"));
        jail.set_env("MEMWAL_ADVERTISE", "grpc+tls://m1.example:1");
        assert!(resolve(&tls).unwrap_err().contains("cluster_tls_ca"));
        jail.set_env("MEMWAL_CLUSTER_TLS_CA", "ca.pem");
        let c = resolve(&tls).map_err(|e| e.to_string())?;
        assert_eq!(
            c.cluster_tls_ca.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
        Ok(())
    });
    figment::Jail::expect_with(|_jail| {
        let args = ServeArgs {
            tables: vec!["t=/x".into()],
            cluster: Some("etcd://e:2379".into()),
            advertise: Some("grpc://10.0.0.1:50051".into()),
            ..Default::default()
        };
        let alone = ServeArgs {
            cluster: None,
            ..args.clone()
        };
        assert!(resolve(&alone)
            .unwrap_err()
            .contains("only used with cluster"));
        Ok(())
    });
}
