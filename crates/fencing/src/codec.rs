//! Manifest bytes: deterministic protobuf, validated on the way in.

use bytes::{BufMut, Bytes, BytesMut};
use memwal_proto::{ShardManifest, ShardStatus};
use prost::Message;

use crate::{FencingError, FencingResult, ShardId};

/// Protobuf field number of the claim token, an unknown field to every
/// reader (prost and Lance's generated types skip it). It makes a claim's
/// bytes unique to its claimer, so a claimer that finds its own bytes at the
/// version it raced for knows the win is its own. Chosen at the top of the
/// field-number range, far from any field the Lance format will allocate.
const CLAIM_TOKEN_FIELD: u32 = 536_870_911;

/// The manifest's bytes (ordered maps: equal messages give equal bytes).
pub fn encode(m: &ShardManifest) -> Bytes {
    Bytes::from(m.encode_to_vec())
}

/// The manifest's bytes followed by a claim token as an unknown
/// length-delimited field.
pub fn encode_with_claim_token(m: &ShardManifest, token: [u8; 16]) -> Bytes {
    let mut buf = BytesMut::with_capacity(m.encoded_len() + 24);
    m.encode(&mut buf).expect("BytesMut grows as needed");
    prost::encoding::encode_key(
        CLAIM_TOKEN_FIELD,
        prost::encoding::WireType::LengthDelimited,
        &mut buf,
    );
    prost::encoding::encode_varint(token.len() as u64, &mut buf);
    buf.put_slice(&token);
    buf.freeze()
}

/// Decodes the manifest stored at `path` for `version` of `shard` and checks
/// it against its path: a message that does not decode, names another
/// version or shard, or holds an unknown status is [`FencingError::Corrupt`].
pub fn decode(
    path: &str,
    bytes: &[u8],
    version: u64,
    shard: ShardId,
) -> FencingResult<ShardManifest> {
    let corrupt = |reason: String| FencingError::Corrupt {
        path: path.to_string(),
        reason,
    };
    let m =
        ShardManifest::decode(bytes).map_err(|e| corrupt(format!("not a ShardManifest: {e}")))?;
    if m.version != version {
        return Err(corrupt(format!(
            "records version {} but is stored as version {version}",
            m.version
        )));
    }
    if let Some(id) = &m.shard_id {
        match ShardId::from_proto(id) {
            Some(found) if found == shard => {}
            Some(found) => return Err(corrupt(format!("belongs to shard {found}, not {shard}"))),
            None => {
                return Err(corrupt(format!(
                    "shard_id holds {} bytes, not 16",
                    id.uuid.len()
                )))
            }
        }
    }
    if ShardStatus::try_from(m.status).is_err() {
        return Err(corrupt(format!("unknown shard status {}", m.status)));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard() -> ShardId {
        ShardId::parse("00000000-0000-4000-8000-000000000001").unwrap()
    }

    // Breaks if the token is not ignorable by a plain decoder, or if two
    // tokens produce equal bytes.
    #[test]
    fn claim_token_is_invisible_to_decoders_but_distinguishes_bytes() {
        let m = ShardManifest {
            version: 2,
            writer_epoch: 1,
            shard_id: Some(shard().to_proto()),
            ..Default::default()
        };
        let a = encode_with_claim_token(&m, [1; 16]);
        let b = encode_with_claim_token(&m, [2; 16]);
        assert_ne!(a, b);
        assert_eq!(decode("p", &a, 2, shard()).unwrap(), m);
        assert_eq!(ShardManifest::decode(b.as_ref()).unwrap(), m);
    }

    // Breaks if garbage, a wrong version, a foreign shard or an unknown
    // status is accepted as a manifest.
    #[test]
    fn corrupt_manifests_are_typed_errors_naming_the_path() {
        let err = decode("m/1.binpb", b"\xff\xff\xff garbage", 1, shard()).unwrap_err();
        assert!(
            matches!(&err, FencingError::Corrupt { path, .. } if path == "m/1.binpb"),
            "{err}"
        );
        let m = ShardManifest {
            version: 3,
            ..Default::default()
        };
        assert!(matches!(
            decode("p", &encode(&m), 4, shard()),
            Err(FencingError::Corrupt { .. })
        ));
        let foreign = ShardManifest {
            version: 1,
            shard_id: Some(ShardId::random().to_proto()),
            ..Default::default()
        };
        assert!(matches!(
            decode("p", &encode(&foreign), 1, shard()),
            Err(FencingError::Corrupt { .. })
        ));
        let bad_status = ShardManifest {
            version: 1,
            status: 7,
            ..Default::default()
        };
        assert!(matches!(
            decode("p", &encode(&bad_status), 1, shard()),
            Err(FencingError::Corrupt { .. })
        ));
    }
}
