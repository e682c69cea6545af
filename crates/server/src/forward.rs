//! Parts of a put forwarded to the daemon that owns their shard in a
//! cluster (`placement.rs`), over Flight `DoPut`, and that daemon's
//! acknowledgement read back.
//!
//! A forwarded put is marked ([`FORWARDED_HEADER`]): its receiver writes
//! only the parts it owns and refuses the others with `UNAVAILABLE`
//! instead of forwarding again, so two daemons that briefly disagree about
//! an owner never bounce a part between them; the client's retry finds the
//! settled owner.

use std::collections::HashMap;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::FlightDescriptor;
use memwal::ProducerSeq;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::ingest::PartAck;
use crate::ServerError;

/// Request header marking a put forwarded by a cluster member (its value:
/// the sender's member id).
pub const FORWARDED_HEADER: &str = "x-memwal-forwarded";

/// The largest message a forward sends or accepts (the daemon's own limit).
const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How a member reaches the others.
#[derive(Clone, Debug, Default)]
pub struct PeerAccess {
    /// The bearer token forwards carry (the members of a cluster share
    /// one).
    pub token: Option<String>,
    /// PEM certificates of the CA that signed the members' TLS
    /// certificates: needed to reach a member that advertises
    /// `grpc+tls://` (its certificate is verified against these, for the
    /// advertised host name).
    pub tls_ca_pem: Option<Vec<u8>>,
}

/// Connections to the other members, one lazily connected channel per
/// address.
pub(crate) struct Peers {
    access: PeerAccess,
    channels: parking_lot::Mutex<HashMap<String, Channel>>,
}

impl Peers {
    /// No connections yet.
    pub(crate) fn new(access: PeerAccess) -> Self {
        Self {
            access,
            channels: Default::default(),
        }
    }

    /// The channel to the member at `advertise` (`grpc://HOST:PORT`, or
    /// `grpc+tls://HOST:PORT`, verified against the cluster's CA).
    fn channel(&self, advertise: &str) -> Result<Channel, String> {
        if let Some(c) = self.channels.lock().get(advertise) {
            return Ok(c.clone());
        }
        let (uri, tls) = if let Some(rest) = advertise.strip_prefix("grpc+tls://") {
            let ca = self.access.tls_ca_pem.as_ref().ok_or_else(|| {
                format!(
                    "member `{advertise}` serves TLS and this daemon has no cluster_tls_ca \
                     (the CA that signed the members' certificates) to verify it"
                )
            })?;
            let host = rest
                .rsplit_once(':')
                .map_or(rest, |(host, _port)| host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name(host);
            (format!("https://{rest}"), Some(tls))
        } else if let Some(rest) = advertise.strip_prefix("grpc://") {
            (format!("http://{rest}"), None)
        } else {
            return Err(format!(
                "member address `{advertise}`: neither grpc://HOST:PORT nor grpc+tls://HOST:PORT"
            ));
        };
        let mut endpoint = Channel::from_shared(uri)
            .map_err(|e| format!("bad member address `{advertise}`: {e}"))?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("member `{advertise}`: TLS: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        self.channels
            .lock()
            .insert(advertise.to_string(), channel.clone());
        Ok(channel)
    }

    /// Writes `batch` (rows, or key-only deletes when `delete`) through
    /// the member at `advertise`, as member `from`, with the producer
    /// sequence `seq` if any; returns the parts it acknowledged (each
    /// durable there). Errors carry the owner's status code
    /// ([`ServerError::Forwarded`]); a connection that could not be made
    /// is `UNAVAILABLE` (nothing sent).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn forward(
        &self,
        advertise: &str,
        from: &str,
        table: &str,
        shards: &str,
        batch: &RecordBatch,
        delete: bool,
        seq: Option<&ProducerSeq>,
    ) -> Result<Vec<PartAck>, ServerError> {
        let failed = |code: tonic::Code, message: String| ServerError::Forwarded {
            table: table.to_string(),
            shard: shards.to_string(),
            owner: advertise.to_string(),
            code,
            message,
        };
        // The chaos suite's scripted bug: acknowledge the part unsent
        // (its checks must catch a forwarder that loses acknowledged rows).
        if memwal_store::broken("broken::forward_ack_unsent") {
            return Ok(shards
                .split(',')
                .map(|shard| PartAck {
                    shard: shard.to_string(),
                    rows: batch.num_rows(),
                    wal_position: Some(1),
                    duplicate: false,
                })
                .collect());
        }
        let channel = self
            .channel(advertise)
            .map_err(|m| failed(tonic::Code::Unavailable, m))?;
        let mut path = vec![table.to_string()];
        if delete {
            path.push("delete".into());
        }
        let mut messages =
            arrow_flight::utils::batches_to_flight_data(&batch.schema(), vec![batch.clone()])
                .map_err(|e| failed(tonic::Code::Internal, format!("encoding the part: {e}")))?;
        if let Some(first) = messages.first_mut() {
            first.flight_descriptor = Some(FlightDescriptor::new_path(path));
        }
        if let (Some(seq), Some(last)) = (seq, messages.last_mut()) {
            last.app_metadata = serde_json::json!({
                "producer_id": seq.producer,
                "producer_epoch": seq.epoch,
                "sequence": seq.sequence,
            })
            .to_string()
            .into();
        }
        let mut request = tonic::Request::new(futures::stream::iter(messages));
        let headers = request.metadata_mut();
        if let Ok(v) = from.parse() {
            headers.insert(FORWARDED_HEADER, v);
        }
        if let Some(t) = &self.access.token {
            if let Ok(v) = format!("Bearer {t}").parse() {
                headers.insert("authorization", v);
            }
        }
        let mut client = FlightServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let started = tokio::time::Instant::now();
        let mut results = client
            .do_put(request)
            .await
            .map_err(|s| failed(s.code(), s.message().to_string()))?
            .into_inner();
        let result = results
            .message()
            .await
            .map_err(|s| failed(s.code(), s.message().to_string()))?
            .ok_or_else(|| {
                failed(
                    tonic::Code::Unknown,
                    "the owner ended the put without an acknowledgement".into(),
                )
            })?;
        metrics::histogram!("memwal_server_forward_seconds", "table" => table.to_string())
            .record(started.elapsed().as_secs_f64());
        #[derive(serde::Deserialize)]
        struct Ack {
            parts: Vec<PartAck>,
        }
        let ack: Ack = serde_json::from_slice(&result.app_metadata).map_err(|e| {
            failed(
                tonic::Code::Unknown,
                format!("the owner's acknowledgement does not decode: {e}"),
            )
        })?;
        Ok(ack.parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Breaks if a TLS member is reached without verifying its certificate
    // (no CA given, yet a channel), or if an address of an unknown scheme
    // is taken for one.
    #[tokio::test]
    async fn a_tls_member_needs_the_cluster_ca_and_bad_addresses_are_refused() {
        let plain = Peers::new(PeerAccess::default());
        assert!(plain.channel("grpc://127.0.0.1:1").is_ok());
        let e = plain.channel("grpc+tls://localhost:1").unwrap_err();
        assert!(e.contains("cluster_tls_ca"), "{e}");
        for bad in ["http://127.0.0.1:1", "127.0.0.1:1", "grpc+tcp://h:1"] {
            let e = plain.channel(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let with_ca = Peers::new(PeerAccess {
            token: None,
            tls_ca_pem: Some(cert.cert.pem().into_bytes()),
        });
        assert!(with_ca.channel("grpc+tls://localhost:1").is_ok());
    }
}
