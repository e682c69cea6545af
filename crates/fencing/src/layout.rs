//! Where a shard's objects live under the table root (docs/memwal-format.md "Layout").

use object_store::path::Path;

use crate::ShardId;

/// `n.reverse_bits()` as a 64-character binary string: sequential numbers
/// spread over the key space (5 -> `101` followed by 61 zeros).
pub fn bitrev64(n: u64) -> String {
    format!("{:064b}", n.reverse_bits())
}

/// Inverse of [`bitrev64`]; `None` unless `s` is exactly 64 binary digits.
pub fn parse_bitrev64(s: &str) -> Option<u64> {
    if s.len() != 64 || !s.bytes().all(|b| b == b'0' || b == b'1') {
        return None;
    }
    u64::from_str_radix(s, 2).ok().map(u64::reverse_bits)
}

/// The directory of a shard's producer checkpoints (never an SSTable's).
pub const PRODUCERS_DIR: &str = "producers";

/// The generation a producer checkpoint's file name carries.
pub fn parse_producers_file(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Paths of one shard's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    shard: ShardId,
    dir: Path,
}

impl ShardLayout {
    /// The layout of `shard` in the table rooted at `table_root`.
    pub fn new(table_root: &Path, shard: ShardId) -> Self {
        let dir = table_root.clone().join("_mem_wal").join(shard.to_string());
        Self { shard, dir }
    }

    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// `{table}/_mem_wal/{shard}`.
    pub fn shard_dir(&self) -> &Path {
        &self.dir
    }

    /// `{shard_dir}/manifest`.
    pub fn manifest_dir(&self) -> Path {
        self.dir.clone().join("manifest")
    }

    /// `{shard_dir}/manifest/{bitrev64(version)}.binpb`.
    pub fn manifest_path(&self, version: u64) -> Path {
        self.manifest_dir()
            .join(format!("{}.binpb", bitrev64(version)))
    }

    /// `{shard_dir}/manifest/version_hint.json`.
    pub fn version_hint_path(&self) -> Path {
        self.manifest_dir().join("version_hint.json")
    }

    /// `{shard_dir}/wal`.
    pub fn wal_dir(&self) -> Path {
        self.dir.clone().join("wal")
    }

    /// `{shard_dir}/wal/{bitrev64(position)}.arrow`.
    pub fn wal_path(&self, position: u64) -> Path {
        self.wal_dir().join(format!("{}.arrow", bitrev64(position)))
    }

    /// `{shard_dir}/producers`: the producer checkpoints
    /// (docs/design/idempotent-producers.md).
    pub fn producers_dir(&self) -> Path {
        self.dir.clone().join(PRODUCERS_DIR)
    }

    /// `{shard_dir}/producers/{generation, 20 digits}.json`: the producers
    /// table as of the end of `generation`.
    pub fn producers_path(&self, generation: u64) -> Path {
        self.producers_dir().join(format!("{generation:020}.json"))
    }

    /// `{shard_dir}/{dir_name}` for an SSTable directory name.
    pub fn sstable_dir(&self, dir_name: &str) -> Path {
        self.dir.clone().join(dir_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if the bit order or width differs from docs/memwal-format.md's example.
    #[test]
    fn bitrev64_matches_the_spec_example() {
        assert_eq!(bitrev64(5), format!("101{}", "0".repeat(61)));
        assert_eq!(bitrev64(1), format!("1{}", "0".repeat(63)));
        for n in [0, 1, 2, 5, 1 << 40, u64::MAX] {
            assert_eq!(parse_bitrev64(&bitrev64(n)), Some(n));
        }
        assert_eq!(parse_bitrev64("101"), None);
        assert_eq!(parse_bitrev64(&"2".repeat(64)), None);
    }

    #[test]
    fn paths_follow_the_layout() {
        let shard = ShardId::parse("00000000-0000-4000-8000-000000000001").unwrap();
        let l = ShardLayout::new(&Path::from("tbl"), shard);
        assert_eq!(
            l.manifest_path(5).as_ref(),
            format!("tbl/_mem_wal/{shard}/manifest/101{}.binpb", "0".repeat(61))
        );
        assert_eq!(
            l.version_hint_path().as_ref(),
            format!("tbl/_mem_wal/{shard}/manifest/version_hint.json")
        );
        assert_eq!(
            l.producers_path(42).as_ref(),
            format!("tbl/_mem_wal/{shard}/producers/00000000000000000042.json")
        );
        assert_eq!(parse_producers_file("00000000000000000042.json"), Some(42));
        assert_eq!(parse_producers_file("42.json"), None);
        assert_eq!(
            l.wal_path(1).as_ref(),
            format!("tbl/_mem_wal/{shard}/wal/1{}.arrow", "0".repeat(63))
        );
    }
}
