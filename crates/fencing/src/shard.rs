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
