//! The MemWAL wire schema: the `lance.table` protobuf messages a MemWAL
//! writer reads and writes (`ShardManifest`, `SsTable`, `MemWalIndexDetails`
//! and their parts).
//!
//! Field numbers match the Lance table format, so bytes written with these
//! types decode with Lance's own generated types and the reverse. Map fields
//! are ordered maps: encoding the same message twice yields the same bytes.

#![allow(missing_docs)]

/// Generated messages of package `lance.table`.
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/lance.table.rs"));
}

pub use pb::*;

impl Uuid {
    /// Wraps 16 raw UUID bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self {
            uuid: bytes.to_vec(),
        }
    }

    /// The 16 raw bytes, or `None` when the message does not hold exactly 16.
    pub fn as_bytes(&self) -> Option<[u8; 16]> {
        self.uuid.as_slice().try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    // Breaks if a field number or type drifts from the Lance contract: the
    // hand-encoded bytes below are what Lance's types produce for these values.
    #[test]
    fn shard_manifest_field_numbers_match_the_contract() {
        let m = ShardManifest {
            version: 3,
            writer_epoch: 7,
            replay_after_wal_entry_position: 5,
            wal_entry_position_last_seen: 9,
            current_generation: 2,
            shard_spec_id: 1,
            status: ShardStatus::Sealed as i32,
            ..Default::default()
        };
        let bytes = m.encode_to_vec();
        // tag = field << 3 | wiretype(0 = varint)
        let expected = vec![
            1 << 3,
            3, // version = 1
            2 << 3,
            7, // writer_epoch = 2
            3 << 3,
            5, // replay_after = 3
            4 << 3,
            9, // last_seen = 4
            6 << 3,
            2, // current_generation = 6
            10 << 3,
            1, // shard_spec_id = 10
            15 << 3,
            1, // status = 15
        ];
        assert_eq!(bytes, expected);
        assert_eq!(ShardManifest::decode(bytes.as_slice()).unwrap(), m);
    }

    // Breaks if maps stop being ordered (HashMap iteration order would make
    // two encodings of the same message differ).
    #[test]
    fn map_encoding_is_deterministic() {
        let mut a = MemWalIndexDetails::default();
        let mut b = MemWalIndexDetails::default();
        for i in 0..64 {
            a.writer_config_defaults
                .insert(format!("k{i}"), format!("v{i}"));
        }
        for i in (0..64).rev() {
            b.writer_config_defaults
                .insert(format!("k{i}"), format!("v{i}"));
        }
        assert_eq!(a.encode_to_vec(), b.encode_to_vec());
    }

    // Breaks if field 12 is dropped or renumbered.
    #[test]
    fn maintain_all_indexes_is_field_12() {
        let d = MemWalIndexDetails {
            maintain_all_indexes: Some(false),
            ..Default::default()
        };
        // Optional proto3 bool: present even when false.
        assert_eq!(d.encode_to_vec(), vec![12 << 3, 0]);
    }

    #[test]
    fn uuid_roundtrip_and_length_check() {
        let u = Uuid::from_bytes([7; 16]);
        assert_eq!(u.as_bytes(), Some([7; 16]));
        let short = Uuid { uuid: vec![1, 2] };
        assert_eq!(short.as_bytes(), None);
    }
}
