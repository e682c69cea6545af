//! Flight messages to record batches without copying their bodies.
//!
//! arrow-flight's `FlightDataDecoder` copies every record batch body into a
//! fresh buffer before decoding it (`Buffer::from(&[u8])`). The body
//! arrives as a `Bytes` view of the received message, and arrow's
//! `Buffer::from(Bytes)` takes it as it is: the decoded arrays point into
//! the message. arrow-ipc still copies a buffer that is not aligned for
//! its type (`read_record_batch` realigns instead of refusing), so the
//! result is the same batch either way, with a copy only where alignment
//! demands one.
//!
//! Only the decoding is here: every message has passed
//! [`crate::decode::check_message`] first (its buffers lie inside its body,
//! its declared sizes are bounded), and the caller catches what arrow-ipc
//! may still panic on.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_flight::FlightData;
use arrow_ipc::MessageHeader;
use arrow_schema::{Schema, SchemaRef};

/// The decoding state of one stream: its schema and dictionaries.
#[derive(Default)]
pub(crate) struct FlightIpc {
    schema: Option<SchemaRef>,
    dictionaries: HashMap<i64, ArrayRef>,
}

impl FlightIpc {
    /// The record batch `data` carries, `None` for a message that only
    /// updates the state (a schema, a dictionary) or carries none (only
    /// `app_metadata`); an error, naming what was wrong, for a message that
    /// does not decode or comes out of order.
    pub(crate) fn decode(&mut self, data: &FlightData) -> Result<Option<RecordBatch>, String> {
        let message = arrow_ipc::root_as_message(&data.data_header[..])
            .map_err(|e| format!("an IPC message header that does not parse: {e}"))?;
        match message.header_type() {
            MessageHeader::NONE => Ok(None),
            MessageHeader::Schema => {
                let schema = Schema::try_from(data)
                    .map_err(|e| format!("a schema message that does not decode: {e}"))?;
                self.schema = Some(Arc::new(schema));
                self.dictionaries.clear();
                Ok(None)
            }
            MessageHeader::DictionaryBatch => {
                let schema = self
                    .schema
                    .as_ref()
                    .ok_or("a dictionary batch before the schema")?;
                let batch = message
                    .header_as_dictionary_batch()
                    .ok_or("a dictionary batch message without its header")?;
                arrow_ipc::reader::read_dictionary(
                    &body(data),
                    batch,
                    schema,
                    &mut self.dictionaries,
                    &message.version(),
                )
                .map_err(|e| format!("a dictionary batch that does not decode: {e}"))?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let schema = self
                    .schema
                    .as_ref()
                    .ok_or("a record batch before the schema")?;
                let batch = message
                    .header_as_record_batch()
                    .ok_or("a record batch message without its header")?;
                arrow_ipc::reader::read_record_batch(
                    &body(data),
                    batch,
                    schema.clone(),
                    &self.dictionaries,
                    None,
                    &message.version(),
                )
                .map(Some)
                .map_err(|e| format!("a record batch that does not decode: {e}"))
            }
            other => Err(format!(
                "an unexpected IPC message ({})",
                other.variant_name().unwrap_or("unknown")
            )),
        }
    }
}

/// The message body as an arrow buffer sharing its memory.
fn body(data: &FlightData) -> Buffer {
    Buffer::from(data.data_body.clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use arrow_array::types::Int32Type;
    use arrow_array::{DictionaryArray, Int64Array, StringArray};
    use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
    use futures::TryStreamExt;

    async fn messages(batches: Vec<RecordBatch>) -> Vec<FlightData> {
        let stream = FlightDataEncoderBuilder::new()
            .with_dictionary_handling(DictionaryHandling::Resend)
            .build(futures::stream::iter(batches.into_iter().map(Ok)));
        stream.try_collect().await.unwrap()
    }

    fn decode_all(msgs: &[FlightData]) -> Vec<RecordBatch> {
        let mut ipc = FlightIpc::default();
        msgs.iter().filter_map(|m| ipc.decode(m).unwrap()).collect()
    }

    /// A batch decodes to what was sent, and its arrays point into the
    /// received message's body (no copy of the values). Breaks if the body
    /// is copied before decoding, as arrow-flight's decoder does.
    #[tokio::test]
    async fn record_batches_decode_into_the_received_body() {
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef,
            ),
            (
                "v",
                Arc::new(StringArray::from_iter_values(
                    (0..1000).map(|i| format!("v{i}")),
                )),
            ),
        ])
        .unwrap();
        let msgs = messages(vec![batch.clone()]).await;
        let got = decode_all(&msgs);
        assert_eq!(got, vec![batch]);
        let body = &msgs.last().unwrap().data_body;
        let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
        let values = got[0].column(1).to_data().buffers()[1].as_ptr() as usize;
        assert!(
            range.contains(&values),
            "the string values were copied out of the message body"
        );
    }

    /// Dictionary-encoded columns decode (the dictionary message first),
    /// and a record batch before any schema is refused with a reason.
    #[tokio::test]
    async fn dictionaries_decode_and_order_is_checked() {
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a", "c"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
        let msgs = messages(vec![batch.clone()]).await;
        assert_eq!(decode_all(&msgs), vec![batch]);
        let mut ipc = FlightIpc::default();
        let err = ipc.decode(msgs.last().unwrap()).unwrap_err();
        assert!(err.contains("before the schema"), "{err}");
    }
}
