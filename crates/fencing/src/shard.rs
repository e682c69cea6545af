use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use memwal_proto::{ShardFieldEntry, Uuid as PbUuid};
use uuid::Uuid;

use crate::FencingError;

/// A shard's identity: a UUID, written in its lowercase hyphenated form in
/// paths. Anything that is not a UUID is rejected at parse time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(Uuid);

impl ShardId {
    /// A fresh random (v4) shard id.
    pub fn random() -> Self {
        Self(Uuid::new_v4())
    }

    /// The shard id memwal gives the shard of sharding spec `spec_id` with
    /// shard field values `values` (field id -> encoded value): the same for
    /// every process that computes it, distinct for distinct specs or
    /// values (a name-based v5 UUID). Writers that create a bucket's shard
    /// at the same time therefore create the same shard, and fencing
    /// settles which of them writes, instead of splitting the bucket over
    /// two shards.
    pub fn for_values(spec_id: u32, values: &std::collections::BTreeMap<String, Vec<u8>>) -> Self {
        /// memwal's namespace for shard ids (a fixed random UUID).
        const NAMESPACE: Uuid = Uuid::from_u128(0x6d65_6d77_616c_4a5e_8b1f_5c0e_2a9d_7f31);
        let mut name = Vec::new();
        name.extend_from_slice(&spec_id.to_le_bytes());
        for (field, value) in values {
            for part in [field.as_bytes(), value.as_slice()] {
                name.extend_from_slice(&(part.len() as u64).to_le_bytes());
                name.extend_from_slice(part);
            }
        }
        Self(Uuid::new_v5(&NAMESPACE, &name))
    }

    /// Parses a UUID in any of its standard text forms.
    pub fn parse(input: &str) -> Result<Self, FencingError> {
        Uuid::parse_str(input.trim())
            .map(Self)
            .map_err(|e| FencingError::InvalidShardId {
                input: input.to_string(),
                reason: e.to_string(),
            })
    }

    /// The UUID.
    pub fn uuid(&self) -> Uuid {
        self.0
    }

    /// The protobuf form (16 raw bytes).
    pub fn to_proto(&self) -> PbUuid {
        PbUuid::from_bytes(*self.0.as_bytes())
    }

    /// Reads the protobuf form; `None` unless it holds exactly 16 bytes.
    pub fn from_proto(pb: &PbUuid) -> Option<Self> {
        pb.as_bytes().map(|b| Self(Uuid::from_bytes(b)))
    }
}

impl From<Uuid> for ShardId {
    fn from(u: Uuid) -> Self {
        Self(u)
    }
}

impl FromStr for ShardId {
    type Err = FencingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

/// What a shard is created with and keeps forever: the sharding spec it
/// belongs to (0 = manually created) and its shard field values (raw
/// little-endian Arrow scalar bytes by shard field id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardIdentity {
    /// `ShardingSpec.spec_id`, or 0 for a manual shard.
    pub spec_id: u32,
    /// Shard field id -> raw value bytes.
    pub field_values: BTreeMap<String, Vec<u8>>,
}

impl ShardIdentity {
    /// A manual shard (spec 0, no field values).
    pub fn manual() -> Self {
        Self::default()
    }

    /// The manifest's `shard_field_entries`, ordered by field id.
    pub fn entries(&self) -> Vec<ShardFieldEntry> {
        self.field_values
            .iter()
            .map(|(k, v)| ShardFieldEntry {
                field_id: k.clone(),
                value: v.clone(),
            })
            .collect()
    }

    /// The identity a manifest records.
    pub fn of_manifest(m: &memwal_proto::ShardManifest) -> Self {
        Self {
            spec_id: m.shard_spec_id,
            field_values: m
                .shard_field_entries
                .iter()
                .map(|e| (e.field_id.clone(), e.value.clone()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if the id of a bucket's shard is not stable across calls (two
    // daemons would create two shards for one bucket) or collides across
    // values, specs or field names.
    #[test]
    fn value_derived_ids_are_stable_and_distinct() {
        let key = |f: &str, v: i32| -> std::collections::BTreeMap<String, Vec<u8>> {
            [(f.to_string(), v.to_le_bytes().to_vec())].into()
        };
        assert_eq!(
            ShardId::for_values(1, &key("bucket", 3)),
            ShardId::for_values(1, &key("bucket", 3))
        );
        let ids = [
            ShardId::for_values(1, &key("bucket", 3)),
            ShardId::for_values(1, &key("bucket", 2)),
            ShardId::for_values(2, &key("bucket", 3)),
            ShardId::for_values(1, &key("b", 3)),
            ShardId::for_values(1, &Default::default()),
        ];
        let distinct: std::collections::BTreeSet<_> = ids.iter().map(|i| i.to_string()).collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    }

    // Breaks if non-UUID ids are accepted (they would create bogus directories).
    #[test]
    fn only_uuids_are_shard_ids() {
        for bad in [
            "",
            "shard-1",
            "../etc",
            "1234",
            "g2c3a1b4-0000-0000-0000-000000000000",
        ] {
            assert!(matches!(
                ShardId::parse(bad),
                Err(FencingError::InvalidShardId { .. })
            ));
        }
        let id = ShardId::parse("2C3A1B40-0000-4000-8000-00000000000A").unwrap();
        assert_eq!(id.to_string(), "2c3a1b40-0000-4000-8000-00000000000a");
        assert_eq!(ShardId::from_proto(&id.to_proto()), Some(id));
    }
}
