//! The process's log output: `tracing` events (and the `log` records of
//! dependencies, lance's among them) on stderr, filtered by `RUST_LOG`
//! (default: warnings and errors).
//!
//! Log levels mean what they say: an ERROR is something an operator must
//! look at. A dependency message known to be logged at ERROR in normal
//! operation is dropped here ([`EXPECTED`]), each with the reason it is
//! expected.

use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Metadata};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Messages (target, exact text) dependencies log at ERROR in normal
/// operation:
///
/// - lance's scalar-index lookup logs every index without fields at
///   ERROR, and the `__lance_mem_wal` system index (the MemWAL state every
///   memwal table carries, `docs/memwal-format.md`) has none by design: every
///   compaction cycle and many reads would log it.
pub const EXPECTED: &[(&str, &str)] = &[("lance::index", "Index __lance_mem_wal has no fields")];

/// Installs the process's subscriber (and the `log` bridge).
pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "warn,lance_io::object_store=error".into());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only for a person at a terminal, not in log files.
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter)
                .with_filter(DropExpected),
        )
        .init();
}

/// Drops the events [`EXPECTED`] lists.
struct DropExpected;

impl<S> Filter<S> for DropExpected {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        // A `log` record arrives as an event of target `log` carrying its
        // own target in the `log.target` field (tracing-log).
        let own = event.metadata().target();
        if own != "log" && !EXPECTED.iter().any(|(t, _)| *t == own) {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let target = fields.target.unwrap_or_else(|| own.to_string());
        !is_expected(&target, || fields.message)
    }
}

/// Whether an event of `target` whose message `message` gives is one
/// [`EXPECTED`] lists (the message is rendered only for a listed target).
fn is_expected(target: &str, message: impl FnOnce() -> Option<String>) -> bool {
    if !EXPECTED.iter().any(|(t, _)| *t == target) {
        return false;
    }
    let Some(text) = message() else {
        return false;
    };
    EXPECTED.iter().any(|(t, m)| *t == target && text == *m)
}

/// An event's `message` field as text, and a `log` record's target.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    target: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = Some(value.to_string()),
            "log.target" => self.target = Some(value.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "log.target" => self.target = Some(format!("{value:?}").trim_matches('"').to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a subscriber with the daemon's filter prints for `emit`.
    fn printed(emit: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("buffer").extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || out.clone())
                .with_filter(DropExpected),
        );
        tracing::subscriber::with_default(subscriber, emit);
        let text = buf.0.lock().expect("buffer").clone();
        String::from_utf8(text).expect("utf-8")
    }

    // Breaks if the filter matches on the event's own target only: a `log`
    // record (as lance writes it) arrives with target `log` and its own
    // target in `log.target` (tracing-log's form, emitted here as it does).
    #[test]
    fn a_bridged_log_record_listed_as_expected_is_not_printed() {
        let dropped = printed(
            || tracing::event!(target: "log", tracing::Level::ERROR, log.target = "lance::index", "Index __lance_mem_wal has no fields"),
        );
        assert_eq!(dropped, "");
        let kept = printed(
            || tracing::event!(target: "log", tracing::Level::ERROR, log.target = "lance::index", "Index vec has no fields"),
        );
        assert!(kept.contains("Index vec has no fields"), "{kept}");
        let other = printed(|| tracing::error!(target: "memwal", "a real error"));
        assert!(other.contains("a real error"), "{other}");
    }

    #[test]
    fn only_the_listed_message_of_the_listed_target_is_dropped() {
        let msg = |s: &str| {
            let s = s.to_string();
            move || Some(s)
        };
        assert!(is_expected(
            "lance::index",
            msg("Index __lance_mem_wal has no fields")
        ));
        assert!(!is_expected(
            "lance::index",
            msg("Index vec_idx has no fields")
        ));
        assert!(!is_expected(
            "lance::dataset",
            msg("Index __lance_mem_wal has no fields")
        ));
    }
}
