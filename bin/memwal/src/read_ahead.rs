//! How far Lance reads ahead of a scan's reader, set once for the process.
//!
//! A Lance scan issues its I/O ahead of whoever pulls its batches, up to an
//! I/O buffer, over several fragments at once. Lance's defaults size both
//! for throughput: an I/O buffer of 32 MiB per I/O thread (256 MiB on a
//! local disk, 2 GiB on an object store) and two fragments per I/O thread
//! (16 and 128). A query whose client stops reading therefore keeps up to
//! that much of the table in the daemon's memory, per level it scans,
//! outside every query budget. Measured before this module (a `SELECT *`
//! client holding one batch, local disk): a 77 MB table read whole, 93 MB
//! of a 155 MB one; with the defaults here, 34 MB of either
//! (`benches/RESULTS.md`).
//!
//! Lance takes these two settings only from its environment
//! (`LANCE_DEFAULT_IO_BUFFER_SIZE`, `LANCE_DEFAULT_FRAGMENT_READAHEAD`; the
//! LSM scanner offers no per-scan option), so [`apply`] sets them from the
//! daemon's settings (`lance_io_buffer_mib`, `lance_fragment_readahead`)
//! before any thread starts. A variable already in the environment is
//! kept: an operator's explicit Lance setting wins.
//!
//! Test: `a_stalled_reader_holds_only_the_scan_read_ahead`
//! (`bin/memwal/tests/daemon/reads.rs`).

use crate::config::ServeConfig;

/// Lance's variable for the I/O buffer of a scan, in bytes.
const IO_BUFFER: &str = "LANCE_DEFAULT_IO_BUFFER_SIZE";
/// Lance's variable for the fragments a scan reads at once.
const FRAGMENT_READAHEAD: &str = "LANCE_DEFAULT_FRAGMENT_READAHEAD";

/// Sets Lance's read-ahead from `config`, unless the environment already
/// sets it. Must run before the process starts any thread (it changes the
/// environment); `main` calls it before building the runtime.
pub fn apply(config: &ServeConfig) {
    let bytes = config.lance_io_buffer_mib.saturating_mul(1 << 20);
    for (var, value) in [
        (IO_BUFFER, bytes.to_string()),
        (
            FRAGMENT_READAHEAD,
            config.lance_fragment_readahead.to_string(),
        ),
    ] {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, value);
        }
    }
}
