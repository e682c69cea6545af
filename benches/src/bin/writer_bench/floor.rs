//! The disk's floor, measured in the same run as the writers: one bare
//! durable object create (what a put-if-not-exists of a local object costs
//! at the least) and sequential fdatasync bandwidth.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `n` creates of `bytes` as new objects under `dir`, each: write a temp
/// file, fsync it, hard-link it to its name (fails if taken), fsync the
/// directory, unlink the temp name. Without `fsync` the same steps minus
/// the two fsyncs. Latencies sorted.
pub fn bare_creates(
    dir: &Path,
    bytes: &[u8],
    n: usize,
    fsync: bool,
) -> std::io::Result<Vec<Duration>> {
    std::fs::create_dir_all(dir)?;
    let dir_handle = File::open(dir)?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let name = dir.join(format!("obj-{i:08}"));
        let tmp = PathBuf::from(format!("{}#1", name.display()));
        let t = Instant::now();
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        if fsync {
            f.sync_all()?;
        }
        drop(f);
        std::fs::hard_link(&tmp, &name)?;
        if fsync {
            dir_handle.sync_all()?;
        }
        std::fs::remove_file(&tmp)?;
        lat.push(t.elapsed());
    }
    std::fs::remove_dir_all(dir)?;
    lat.sort_unstable();
    Ok(lat)
}

/// MB/s of writing `total` bytes to one new file in `chunk`-byte writes,
/// each followed by `fdatasync`.
pub fn fdatasync_bandwidth(dir: &Path, total: usize, chunk: usize) -> std::io::Result<f64> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("seq");
    let buf: Vec<u8> = (0..chunk).map(|i| (i * 131 % 251) as u8).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let t = Instant::now();
    let mut written = 0;
    while written < total {
        f.write_all(&buf)?;
        f.sync_data()?;
        written += chunk;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_dir_all(dir)?;
    Ok(written as f64 / secs / 1e6)
}
