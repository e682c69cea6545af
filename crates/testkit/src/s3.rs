//! Locations on a real S3-compatible server for tests that must run against S3.
//!
//! The server is chosen by environment variables:
//!
//! - `MEMWAL_TEST_S3_URI`: the bucket (and optional prefix) to use, e.g.
//!   `s3://memwal-test`. The bucket must already exist.
//! - the standard `AWS_*` variables for the client: `AWS_ENDPOINT_URL`
//!   (e.g. `http://127.0.0.1:5555`), `AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (and `AWS_ALLOW_HTTP=true` for a
//!   non-loopback plain-HTTP endpoint).
//!
//! `.ci/run` starts a local moto server and sets all of them;
//! `scripts/s3-server.sh start` does the same for a developer and prints the
//! `export` lines to paste into a shell.
//!
//! Without `MEMWAL_TEST_S3_URI` an S3 test is skipped, except under
//! `CI=true`, where a missing server is a failure so that CI can never go
//! green without having run the S3 tests. The skip is visible: crates that
//! build with `s3_tests_cfg.rs` (next to this crate's manifest) mark their
//! S3 tests `#[cfg_attr(not(memwal_s3_tests), ignore = "...")]`, so
//! `cargo test` lists them as ignored with the reason; a test that runs
//! anyway (e.g. `--ignored`) gets `None` here and a `SKIPPED` line on the
//! terminal.

use std::io::Write;

use memwal_store::StoreLocation;

/// The environment variable naming the test bucket, e.g. `s3://memwal-test`.
pub const S3_URI_ENV: &str = "MEMWAL_TEST_S3_URI";

/// A fresh, empty location on the S3 test server, or `None` when no server is
/// configured (the test should then return early; a `SKIPPED` line is
/// written to the terminal).
///
/// Every call gets its own prefix, `{test_name}-{uuid}`, under
/// `MEMWAL_TEST_S3_URI`, so tests and repeated runs never see each other's
/// objects. Nothing is deleted afterwards; the server is throw-away.
///
/// # Panics
///
/// - when `MEMWAL_TEST_S3_URI` is unset or empty and `CI` is `true`: CI must
///   run the S3 tests, not skip them;
/// - when the URI cannot be opened as a store (a broken configuration).
pub fn s3_test_location(test_name: &str) -> Option<StoreLocation> {
    let base = std::env::var(S3_URI_ENV)
        .ok()
        .map(|uri| uri.trim().trim_end_matches('/').to_string())
        .filter(|uri| !uri.is_empty());
    let Some(base) = base else {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!(
                "S3 test server required under CI=true: {S3_URI_ENV} unset \
                 (test `{test_name}`; .ci/run starts one with scripts/s3-server.sh)"
            );
        }
        // Straight to the process's stderr: the test harness captures
        // `eprintln!` and shows it only for failing tests.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED S3 test `{test_name}`: {S3_URI_ENV} unset \
             (run `scripts/s3-server.sh start` and export what it prints to enable)"
        );
        return None;
    };
    let prefix = format!("{}-{}", sanitize(test_name), uuid::Uuid::new_v4().simple());
    let uri = format!("{base}/{prefix}");
    match memwal_store::open_store(&uri) {
        Ok(location) => Some(location),
        Err(e) => panic!("cannot open S3 test location `{uri}` (from {S3_URI_ENV}): {e}"),
    }
}

/// Keeps a test name usable as one object-key segment.
fn sanitize(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "test".to_string()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::sanitize;

    #[test]
    fn test_names_become_single_key_segments() {
        assert_eq!(sanitize("store::s3/create"), "store--s3-create");
        assert_eq!(sanitize(""), "test");
        assert_eq!(sanitize("a_b-9"), "a_b-9");
    }
}
