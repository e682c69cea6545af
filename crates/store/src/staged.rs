//! Staged files a crash left behind in a local store.
//!
//! A local write stages its bytes in `{name}#{n}` (object_store's
//! `LocalFileSystem` and the direct path alike), then links or renames it
//! into place and removes the staged name. A crash before the link leaves
//! the staged file; a crash between link and unlink leaves a second name
//! for the object. LIST hides both (`#` names are not objects), so nothing
//! that works through the object store ever sees them: [`sweep_staged`]
//! finds them on the file system.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::StoreLocation;

/// The directory a local location (a path or `file://` URI) is rooted at;
/// `None` for other stores, which stage nothing on a file system.
pub fn local_dir(loc: &StoreLocation) -> Option<PathBuf> {
    let base = if !loc.uri.contains("://") {
        PathBuf::from(&loc.uri)
    } else {
        url::Url::parse(&loc.uri)
            .ok()
            .filter(|u| u.scheme() == "file")?
            .to_file_path()
            .ok()?
    };
    Some(loc.root.parts().fold(base, |p, part| p.join(part.as_ref())))
}

/// Whether `name` is a staged name (`{object}#{digits}`).
pub fn is_staged_name(name: &str) -> bool {
    name.rsplit_once('#').is_some_and(|(object, n)| {
        !object.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Removes (unless `dry_run`) every staged file under `dir` last modified
/// longer than `grace` ago, returning their paths. Younger ones may belong
/// to a write in flight and are left. A missing `dir` is empty.
pub fn sweep_staged(dir: &Path, grace: Duration, dry_run: bool) -> io::Result<Vec<PathBuf>> {
    let mut swept = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                todo.push(entry.path());
                continue;
            }
            if !is_staged_name(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let age = entry
                .metadata()?
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .unwrap_or_default();
            if age < grace {
                continue;
            }
            if !dry_run {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            }
            swept.push(entry.path());
        }
    }
    swept.sort();
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_names_are_recognised() {
        assert!(is_staged_name("0001.arrow#1"));
        assert!(is_staged_name("x.binpb#12"));
        assert!(!is_staged_name("0001.arrow"));
        assert!(!is_staged_name("a#b"));
        assert!(!is_staged_name("#1"));
        assert!(!is_staged_name("a#"));
    }
}
