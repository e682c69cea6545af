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

/// Removes `dir` and the directories below it when they hold no file
/// (object stores have no directories; a local one keeps them after their
/// objects are deleted). Returns whether `dir` is gone. A directory that
/// holds a file, or gets one meanwhile, stays (removing a non-empty
/// directory fails, and a write into a removed one recreates it).
pub fn remove_empty_dirs(dir: &Path) -> io::Result<bool> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    let mut empty = true;
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            empty &= remove_empty_dirs(&entry.path())?;
        } else {
            empty = false;
        }
    }
    if !empty {
        return Ok(false);
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        // A file arrived meanwhile (ENOTEMPTY): it stays.
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_directories_go_and_ones_holding_a_file_stay() {
        let root = tempfile::tempdir().expect("tempdir");
        let gone = root.path().join("a_gen_1");
        std::fs::create_dir_all(gone.join("data/x")).expect("mkdir");
        let kept = root.path().join("a_gen_2");
        std::fs::create_dir_all(kept.join("data")).expect("mkdir");
        std::fs::write(kept.join("data/f.lance"), b"x").expect("write");
        assert!(remove_empty_dirs(&gone).expect("remove"));
        assert!(!gone.exists());
        assert!(!remove_empty_dirs(&kept).expect("remove"));
        assert!(kept.join("data/f.lance").exists());
        assert!(remove_empty_dirs(&root.path().join("missing")).expect("remove"));
    }

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
